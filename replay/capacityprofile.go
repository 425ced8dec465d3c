package replay

import "github.com/kvload-exporter/kvload-exporter/idealcache"

// CapacityStep is idealcache.CapacityStep: the model and its callers name
// the ideal cache's definitions as replay's.
type CapacityStep = idealcache.CapacityStep

// CapacityProfile is idealcache.CapacityProfile.
type CapacityProfile = idealcache.CapacityProfile

// The model's ceilings and the profile's bound, as idealcache defines them.
const (
	DefaultModelCeilingTokens = idealcache.DefaultCeilingTokens
	MaxModelCeilingTokens     = idealcache.MaxCeilingTokens
	ProfileMaxBlocks          = idealcache.ProfileMaxBlocks
)

// AcceptProfile is Accept, with the request's theoretical hit at every
// capacity up to the model's ceiling.
func (m *CacheModel) AcceptProfile(it PacerItem) (tokens int, known bool, profile CapacityProfile) {
	return m.accept(it, 0, false)
}

// AcceptObservedProfile is AcceptObserved, with the request's theoretical
// hit at every capacity up to the model's ceiling.
func (m *CacheModel) AcceptObservedProfile(it PacerItem, cached int) (tokens int, known bool, profile CapacityProfile) {
	return m.accept(it, cached, true)
}
