package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvload-exporter/kvload-exporter/config"
)

func TestParseShardFlag(t *testing.T) {
	for _, c := range []struct {
		spec     string
		count    int
		hostname string
		want     *config.Shard
		err      string
	}{
		{spec: "", want: nil},
		{spec: "0/1", want: &config.Shard{Index: 0, Count: 1}},
		{spec: "2/3", want: &config.Shard{Index: 2, Count: 3}},
		{spec: "auto", count: 3, hostname: "kvload-exporter-2", want: &config.Shard{Index: 2, Count: 3}},
		{spec: "auto", count: 1, hostname: "kvload-0", want: &config.Shard{Index: 0, Count: 1}},
		{spec: "auto", count: 12, hostname: "a-b-11", want: &config.Shard{Index: 11, Count: 12}},
		{spec: "3/3", err: "INDEX must be in 0..COUNT-1"},
		{spec: "-1/3", err: "INDEX must be in 0..COUNT-1"},
		{spec: "0/0", err: "COUNT at least 1"},
		{spec: "1", err: "want INDEX/COUNT"},
		{spec: "a/b", err: "want INDEX/COUNT"},
		{spec: "1/3/4", err: "want INDEX/COUNT"},
		{spec: "1/3", count: 3, err: "--shard.count goes only with --shard=auto"},
		{spec: "", count: 3, err: "--shard.count needs --shard=auto"},
		{spec: "auto", hostname: "kvload-1", err: "needs --shard.count"},
		{spec: "auto", count: 3, hostname: "kvload-3", err: "gives ordinal 3, but --shard.count is 3"},
		{spec: "auto", count: 3, hostname: "kvload", err: "does not end in -ORDINAL"},
		{spec: "auto", count: 3, hostname: "2", err: "does not end in -ORDINAL"},
		{spec: "auto", count: 3, hostname: "kvload-", err: "does not end in -ORDINAL"},
		{spec: "auto", count: 3, hostname: "kvload-01", err: "does not end in -ORDINAL"},
		{spec: "auto", count: 3, hostname: "kvload-+1", err: "does not end in -ORDINAL"},
		{spec: "auto", count: 3, hostname: "", err: "does not end in -ORDINAL"},
	} {
		got, err := parseShardFlag(c.spec, c.count, c.hostname)
		name := fmt.Sprintf("--shard=%q --shard.count=%d hostname %q", c.spec, c.count, c.hostname)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one containing %q", name, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.err == "" && !reflect.DeepEqual(got, c.want):
			t.Errorf("%s = %+v, want %+v", name, got, c.want)
		}
	}
}

// TestShardFlagRejected: a bad --shard is bad usage (exit 2), reported
// before anything starts.
func TestShardFlagRejected(t *testing.T) {
	var stderr bytes.Buffer
	cfg := filepath.Join("..", "..", "examples", "quickstart.yml")
	code := run(context.Background(), []string{"--config.file=" + cfg, "--web.listen-address=127.0.0.1:0", "--shard=3/3"}, streams{stdout: io.Discard, stderr: &stderr})
	if code != exitBadInput || !strings.Contains(stderr.String(), "--shard=3/3") {
		t.Errorf("exit code %d, want %d; stderr:\n%s", code, exitBadInput, stderr.String())
	}
}
