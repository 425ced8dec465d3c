package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvload-exporter/kvload-exporter/config"
)

// ParseShardFlag is parseShardFlag for the shipping checks, which hold
// the Kubernetes example's pods to it.
func ParseShardFlag(spec string, count int, hostname string) (*config.Shard, error) {
	return parseShardFlag(spec, count, hostname)
}

// parseShardFlag resolves --shard and --shard.count into the shard that
// overrides every workload's own, or nil when --shard is not given.
//
//	--shard=INDEX/COUNT              this replica is INDEX of COUNT
//	--shard=auto --shard.count=N     INDEX is the hostname's trailing
//	                                 ordinal: StatefulSet pod kvload-2 is 2
//
// hostname is only read for auto.
func parseShardFlag(spec string, count int, hostname string) (*config.Shard, error) {
	switch spec {
	case "":
		if count != 0 {
			return nil, fmt.Errorf("--shard.count needs --shard=auto")
		}
		return nil, nil
	case "auto":
		if count < 1 {
			return nil, fmt.Errorf("--shard=auto needs --shard.count=N (the number of replicas), N ≥ 1")
		}
		i := strings.LastIndexByte(hostname, '-')
		idx, err := strconv.Atoi(hostname[i+1:])
		if i < 0 || err != nil || idx < 0 || hostname[i+1:] != strconv.Itoa(idx) {
			return nil, fmt.Errorf("--shard=auto: hostname %q does not end in -ORDINAL (as a StatefulSet pod name like kvload-2 does)", hostname)
		}
		if idx >= count {
			return nil, fmt.Errorf("--shard=auto: hostname %q gives ordinal %d, but --shard.count is %d (more replicas than shards?)", hostname, idx, count)
		}
		return &config.Shard{Index: idx, Count: count}, nil
	}
	if count != 0 {
		return nil, fmt.Errorf("--shard.count goes only with --shard=auto; --shard=%s names its count", spec)
	}
	is, cs, ok := strings.Cut(spec, "/")
	idx, err1 := strconv.Atoi(is)
	n, err2 := strconv.Atoi(cs)
	if !ok || err1 != nil || err2 != nil {
		return nil, fmt.Errorf("--shard=%q: want INDEX/COUNT (such as 0/3) or auto", spec)
	}
	if n < 1 || idx < 0 || idx >= n {
		return nil, fmt.Errorf("--shard=%s: INDEX must be in 0..COUNT-1 and COUNT at least 1", spec)
	}
	return &config.Shard{Index: idx, Count: n}, nil
}
