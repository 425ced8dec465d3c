package replay

// Params is the cache the model stands for, as it uses it (block sizes of
// at least 1). They never change: a cache of another size is another
// model (Workload.SetCache).
func (m *CacheModel) Params() CacheParams { return m.cache.p }
