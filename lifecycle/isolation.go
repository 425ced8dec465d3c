package lifecycle

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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
