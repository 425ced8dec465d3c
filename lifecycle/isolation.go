package lifecycle

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
)

// saltHexDigits is the length of a cache salt: 64 bits of SHA-256 keep
// the units of every exporter on an engine apart.
const saltHexDigits = 16

// newEpoch draws the epoch of one daemon's salts: a restart, or a second
// deployment of the same configuration, draws another and shares nothing
// with this one.
func newEpoch() string { return rand.Text() }

// cacheSalt is the cache salt of workload w on target t in epoch. The
// target is in it too: two targets of one configuration on one engine
// (an A/B pair) each have a model of their own, so each must have a cache
// of its own.
func cacheSalt(epoch, w, t string) string {
	h := sha256.New()
	for _, part := range []string{"kvload-exporter cache salt", epoch, w, t} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:saltHexDigits]
}

// unitSalt is the cache salt of workload w on target t, "" when t does not
// isolate; fresh says that no request can have carried it before: its
// epoch is this daemon's own and no unit of this daemon sent it yet, so
// the engine holds nothing of it. Owner goroutine only.
func (d *Daemon) unitSalt(w *config.Workload, t *config.Target, logger log.Logger) (salt string, fresh bool) {
	if !t.Cache.Isolate {
		return "", false
	}
	epoch, from := d.epoch, "drawn at this start"
	if t.Cache.IsolationEpoch != "" {
		epoch, from = t.Cache.IsolationEpoch, "configured"
	}
	salt = cacheSalt(epoch, w.Name, t.Name)
	fresh = t.Cache.IsolationEpoch == "" && !d.saltsSent[salt]
	d.saltsSent[salt] = true
	level.Info(logger).Log("msg", "requests carry a cache salt of their own: the engine shares their prefixes with no other client", "epoch", from, "engine_holds_nothing_yet", fresh)
	return salt, fresh
}
