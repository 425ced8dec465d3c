package kvevents

import (
	"errors"
	"time"
)

// Class is why a block the theoretical model counted as a hit was not
// served from the engine's cache.
type Class string

// The classes of kvload_cache_missed_hit_tokens_total.
const (
	// ClassEvicted: the engine stored the block and removed it before the
	// request (or while it waited): memory pressure. A block held when
	// the stream lost batches that no replay gave back, and not seen
	// since, reads as evicted too: the lost batches removed it.
	ClassEvicted Class = "evicted"
	// ClassNeverStored: the engine the request went to never stored the
	// block: another replica has it (a router that does not route by
	// prefix), or the engine saw other tokens (a tokenization or template
	// mismatch), or the request that would store it was still in flight.
	ClassNeverStored Class = "never_stored"
	// ClassCleared: the block went with the whole cache (AllBlocksCleared:
	// a cache reset, or the engine restarted).
	ClassCleared Class = "cleared"
	// ClassUnexplained: the events say the block was there and it was not
	// served (on every replica, when there are several), or the model
	// counted a hit beyond the engine's last full block.
	ClassUnexplained Class = "unexplained"
)

// Classes lists every class, in the order the metrics name them.
var Classes = [...]Class{ClassEvicted, ClassNeverStored, ClassCleared, ClassUnexplained}

// Miss is one request's missed hit, in the engine's tokens.
type Miss struct {
	// Tokens is the prompt as the engine saw it (its chat template
	// included).
	Tokens []uint32
	// From and To bound the tokens missed: the engine served From tokens
	// from its cache, the model said To.
	From, To int
	// BlockSize is the engine's block size, used while no stream has sent
	// a BlockStored that tells it.
	BlockSize int
	// Sent is when the request was sent; Until when the engine had looked
	// it up (its first token): a block removed between the two was evicted
	// while the request waited.
	Sent, Until time.Time
	// Salt is the cache salt the request carried, "" for none: on a
	// stream that keys blocks by their extra keys, its blocks are those
	// stored under the same salt.
	Salt string
}

// Tally is missed tokens by class.
type Tally map[Class]int

// errNoBlockSize: no stream told its block size and none was given.
var errNoBlockSize = errors.New("the block size is unknown")

// Classify splits m's missed tokens by class, from what the streams of
// one target (one per replica) saw as of m.Sent. A block is classified
// from each stream's state: held on every stream, it is unexplained; held
// on some only, never stored where the request went; else evicted where
// some stream removed it, cleared where the cache was emptied, and never
// stored otherwise. A prefix cache serves a block only after every block
// before it, so a block held behind a missed one is missed for that one's
// reason. A salted request's blocks are looked up under its salt on the
// streams whose events carry extra keys, and by their tokens alone on the
// others; on each stream in its prefix group (PrefixGroup), at the block
// size of the first stream that told one (else m.BlockSize).
func Classify(streams []*Stream, m Miss) (Tally, error) {
	bs := m.BlockSize
	groups := make([]int, len(streams))
	told := false
	for j, s := range streams {
		g, b := s.PrefixGroup()
		groups[j] = g
		if b > 0 && !told {
			bs, told = b, true
		}
	}
	if bs <= 0 {
		return nil, errNoBlockSize
	}
	tally := Tally{}
	if m.To <= m.From {
		return tally, nil
	}
	full := len(m.Tokens) / bs // blocks the engine can hold of this prompt
	first, last := m.From/bs, (m.To-1)/bs
	n := min(last+1, full) // blocks looked up
	var classes []Class
	if first < n {
		// The keys of the prompt's blocks, by the group they are looked
		// up in and whether under the request's salt.
		type lookup struct {
			group  int
			salted bool
		}
		keys := map[lookup][]chainKey{}
		per := make([][]State, len(streams))
		for j, s := range streams {
			l := lookup{groups[j], m.Salt != "" && s.keyedByExtraKeys()}
			if keys[l] == nil {
				extra := ExtraKeys("")
				if l.salted {
					extra = saltExtraKeys(m.Salt)
				}
				keys[l] = requestKeys(m.Tokens, bs, n, l.group, extra)
			}
			per[j] = s.states(keys[l][first:], m.Sent, m.Until)
		}
		classes = combine(per, n-first)
	}
	carry := Class("")
	for b := first; b <= last; b++ {
		c := ClassUnexplained // beyond the prompt's last full block
		if b-first < len(classes) {
			c = classes[b-first]
		}
		if c == ClassUnexplained && carry != "" {
			c = carry // held, but behind a block that was not
		} else if c != ClassUnexplained {
			carry = c
		}
		lo, hi := max(m.From, b*bs), min(m.To, (b+1)*bs)
		tally[c] += hi - lo
	}
	return tally, nil
}

// requestKeys are the keys of a prompt's first n blocks of bs tokens in
// KV cache group group, the first block's extra keys being first.
func requestKeys(tokens []uint32, bs, n, group int, first ExtraKeys) []chainKey {
	keys := make([]chainKey, n)
	k := rootKey("", group)
	for i := range keys {
		var extra ExtraKeys
		if i == 0 {
			extra = first
		}
		k = nextKey(k, tokens[i*bs:(i+1)*bs], extra)
		keys[i] = k
	}
	return keys
}

// combine classifies each of n blocks from its state on every stream.
func combine(per [][]State, n int) []Class {
	out := make([]Class, n)
	for i := range out {
		alive, evicted, cleared := 0, false, false
		for _, states := range per {
			switch states[i] {
			case Alive:
				alive++
			case Evicted, Lost:
				// Lost: held when batches were lost, which would have
				// removed it (an AllBlocksCleared among them is rarer
				// than a removal).
				evicted = true
			case Cleared:
				cleared = true
			}
		}
		switch {
		case alive > 0 && alive == len(per):
			out[i] = ClassUnexplained
		case alive > 0:
			out[i] = ClassNeverStored
		case evicted:
			out[i] = ClassEvicted
		case cleared:
			out[i] = ClassCleared
		default:
			out[i] = ClassNeverStored
		}
	}
	return out
}
