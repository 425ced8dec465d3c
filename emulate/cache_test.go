package emulate

import (
	"net/http"
	"testing"
)

// A repeated prompt of n tokens hits floor((n-1)/B)*B tokens: full blocks
// only, and never the last token.
func TestCacheRepeatedPrompt(t *testing.T) {
	const B = 16
	for _, n := range []int{1, 2, 15, 16, 17, 31, 32, 33, 100, 513} {
		e, srv := newTestServer(t, Config{BlockSize: B})
		prompt := seq(7, n)
		if u := complete(t, srv.URL, prompt, nil); u.cached(t) != 0 {
			t.Fatalf("n=%d: cold request hit %d", n, u.cached(t))
		}
		want := (n - 1) / B * B
		if u := complete(t, srv.URL, prompt, nil); u.cached(t) != want {
			t.Fatalf("n=%d: second request hit %d, want %d", n, u.cached(t), want)
		}
		if st := e.Stats(); st.CachedTokens != int64(want) || st.CacheHitTokens != int64(want) || st.CacheQueryTokens != int64(2*n) {
			t.Fatalf("n=%d: stats %+v", n, st)
		}
	}
}

func TestCacheSharedPrefixes(t *testing.T) {
	const B = 16
	base := seq(1, 5*B+3) // five full blocks and a partial one
	tests := []struct {
		name   string
		prompt []int
		want   int
	}{
		{"shares three full blocks", append(append([]int(nil), base[:3*B]...), seq(50000, 40)...), 3 * B},
		{"shares all five full blocks", append(append([]int(nil), base[:5*B]...), seq(50000, 40)...), 5 * B},
		// The partial sixth block of base was never cached, so sharing
		// 5 blocks and 3 tokens still hits 5 blocks.
		{"partial block never hits", append(append([]int(nil), base...), seq(50000, 40)...), 5 * B},
		{"differs inside the first block", append([]int{99999}, base[1:]...), 0},
		{"differs in the third block", append(append(append([]int(nil), base[:2*B+5]...), 99999), base[2*B+6:]...), 2 * B},
		{"shorter than a block", base[:B-1], 0},
		{"exactly two blocks: last token recomputed", base[:2*B], B},
		{"two blocks and one token", base[:2*B+1], 2 * B},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv := newTestServer(t, Config{BlockSize: B})
			complete(t, srv.URL, base, nil)
			if got := complete(t, srv.URL, tt.prompt, nil).cached(t); got != tt.want {
				t.Fatalf("hit %d, want %d", got, tt.want)
			}
		})
	}
}

func TestCacheSalt(t *testing.T) {
	_, srv := newTestServer(t, Config{BlockSize: 4})
	p := seq(1, 13)
	complete(t, srv.URL, p, nil)
	if got := complete(t, srv.URL, p, map[string]any{"cache_salt": "a"}).cached(t); got != 0 {
		t.Fatalf("salted prompt hit the unsalted one: %d", got)
	}
	if got := complete(t, srv.URL, p, map[string]any{"cache_salt": "a"}).cached(t); got != 12 {
		t.Fatalf("same salt hit %d, want 12", got)
	}
	if got := complete(t, srv.URL, p, map[string]any{"cache_salt": "b"}).cached(t); got != 0 {
		t.Fatalf("other salt hit %d", got)
	}
}

func TestCacheLRUEviction(t *testing.T) {
	const B = 4
	e, srv := newTestServer(t, Config{BlockSize: B, CapacityBlocks: 4})
	a, b, c := seq(100, 2*B+1), seq(200, 2*B+1), seq(300, 2*B+1) // two blocks each
	complete(t, srv.URL, a, nil)
	complete(t, srv.URL, b, nil)
	if got := e.Stats().Cache.Blocks; got != 4 {
		t.Fatalf("%d blocks cached, want 4", got)
	}
	// Touch a, so b is the least recently used.
	if got := complete(t, srv.URL, a, nil).cached(t); got != 2*B {
		t.Fatalf("a hit %d", got)
	}
	complete(t, srv.URL, c, nil) // evicts b
	if got := e.Stats().Cache.Blocks; got != 4 {
		t.Fatalf("%d blocks cached, want 4", got)
	}
	if got := complete(t, srv.URL, a, nil).cached(t); got != 2*B {
		t.Fatalf("a hit %d after c, want %d", got, 2*B)
	}
	if got := complete(t, srv.URL, c, nil).cached(t); got != 2*B {
		t.Fatalf("c hit %d, want %d", got, 2*B)
	}
	if got := complete(t, srv.URL, b, nil).cached(t); got != 0 {
		t.Fatalf("b hit %d after eviction, want 0", got)
	}
}

// A chain's tail goes before its head, so a long prompt under pressure
// keeps a reachable prefix rather than orphaned blocks.
func TestCacheEvictsTailFirst(t *testing.T) {
	c := newTrieCache(1, 3, false, true)
	c.insert(claim{tokens: seq(1, 4)}) // 4 blocks, capacity 3: the first 3 kept
	if got, _ := c.lookup("", seq(1, 5)); got != 3 {
		t.Fatalf("hit %d, want the first 3 blocks", got)
	}
	c.insert(claim{tokens: seq(100, 2)}) // must evict a's tail, not its head
	if got, _ := c.lookup("", seq(1, 5)); got != 1 {
		t.Fatalf("hit %d after pressure, want 1 (a's head)", got)
	}
}

func TestCacheControl(t *testing.T) {
	const B = 4
	e, srv := newTestServer(t, Config{BlockSize: B})
	p := seq(1, 3*B+1)
	warm := func() int {
		complete(t, srv.URL, p, nil)
		return complete(t, srv.URL, p, nil).cached(t)
	}
	if got := warm(); got != 3*B {
		t.Fatalf("warm hit %d", got)
	}

	e.SetCacheEnabled(false)
	if got := warm(); got != 0 {
		t.Fatalf("disabled cache hit %d", got)
	}
	if st := e.Stats(); st.Cache.Enabled || st.Cache.Blocks != 0 {
		t.Fatalf("disabled cache state %+v", st.Cache)
	}
	e.SetCacheEnabled(true)
	if got := warm(); got != 3*B {
		t.Fatalf("re-enabled cache hit %d", got)
	}

	e.Flush()
	if got := e.Stats().Cache.Blocks; got != 0 {
		t.Fatalf("%d blocks after flush", got)
	}
	if got := complete(t, srv.URL, p, nil).cached(t); got != 0 {
		t.Fatalf("hit %d after flush", got)
	}

	if err := e.Resize(1); err != nil {
		t.Fatal(err)
	}
	if got := e.Stats().Cache.Blocks; got != 1 {
		t.Fatalf("%d blocks after resize to 1", got)
	}
	if err := e.Resize(-1); err == nil {
		t.Fatal("Resize(-1) succeeded")
	}

	// The same through HTTP.
	var st CacheState
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"capacity_blocks": 0}, http.StatusOK, &st)
	if st.CapacityBlocks != 0 || !st.Enabled {
		t.Fatalf("state %+v", st)
	}
	complete(t, srv.URL, p, nil)
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"flush": true}, http.StatusOK, &st)
	if st.Blocks != 0 {
		t.Fatalf("state after flush %+v", st)
	}
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"enabled": false}, http.StatusOK, &st)
	if st.Enabled {
		t.Fatalf("state %+v", st)
	}
	if got := warm(); got != 0 {
		t.Fatalf("disabled over HTTP, hit %d", got)
	}
	postDecode(t, srv.URL+"/emulator/cache", map[string]any{"capacity_blocks": -3}, http.StatusBadRequest, nil)

	var stats Stats
	resp, err := http.Get(srv.URL + "/emulator/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := decodeJSON(resp, &stats); err != nil {
		t.Fatal(err)
	}
	if want := e.Stats(); stats != want {
		t.Fatalf("GET /emulator/stats %+v, Stats() %+v", stats, want)
	}
}

// Block keys are exact: different token sequences never share one.
func TestChunkKeyExact(t *testing.T) {
	seqs := [][]int{{}, {0}, {1}, {0, 1}, {1, 0}, {1, 2}, {258}, {128}, {0, 128}, {128, 0}, {1 << 31}, {199999, 7}}
	seen := map[string][]int{}
	for _, s := range seqs {
		k := chunkKey(s)
		if prev, ok := seen[k]; ok {
			t.Fatalf("%v and %v share key %q", prev, s, k)
		}
		seen[k] = s
	}
}
