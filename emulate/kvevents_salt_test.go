package emulate

import (
	"reflect"
	"testing"
)

// TestKVEventsSaltExtraKeys: a salted prompt's first block carries its
// cache salt in extra_keys, as vLLM's map encoding sends it (a one-element
// tuple on the block at token 0, nil on every other block), and its hashes
// differ from those of the same tokens unsalted; the older array form has
// no extra_keys at all.
func TestKVEventsSaltExtraKeys(t *testing.T) {
	for _, format := range []KVEventsFormat{KVEventsMap, KVEventsArray} {
		t.Run(string(format), func(t *testing.T) {
			_, base, sub := startPublishing(t, Config{BlockSize: 4, KVEvents: "tcp://127.0.0.1:0", KVEventsFormat: format})

			salted := map[string]any{"cache_salt": "tenant-a"}
			complete(t, base, seq(1, 9), salted)  // blocks 1-4, 5-8 under the salt
			complete(t, base, seq(1, 13), salted) // 9-12 after them
			complete(t, base, seq(1, 9), nil)     // 1-4, 5-8 again, unsalted
			events, _ := sub.next(t, format, 3)

			first, second, plain := events[0], events[1], events[2]
			if first.Parent != nil || second.Parent == nil || plain.Parent != nil {
				t.Fatalf("events %v: want a first prompt, its extension, and a first prompt", events)
			}
			if reflect.DeepEqual(first.Hashes, plain.Hashes) {
				t.Errorf("the salted and the unsalted blocks of the same tokens have the same hashes %v", first.Hashes)
			}
			want := []any{
				[]any{[]any{"tenant-a"}, nil}, // the salt on the block at token 0 only
				[]any{nil},                    // an extension: none
				[]any{nil, nil},               // unsalted: none
			}
			if format == KVEventsArray {
				want = []any{nil, nil, nil}
			}
			for i, ev := range events {
				if !reflect.DeepEqual(ev.ExtraKeys, want[i]) {
					t.Errorf("event %d (%v): extra_keys %#v, want %#v", i, ev, ev.ExtraKeys, want[i])
				}
			}
		})
	}
}
