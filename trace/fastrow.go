package trace

import "math"

// fastRow parses the one shape nearly every Mooncake row has,
//
//	{"timestamp": 12, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
//
// (keys in that order, plain decimal integers, hash_ids optional), without
// building a Record. ok is false for anything else, including every row
// ParseRecord would reject, which is then left to ParseRecord for the
// error message: on such a row both give the same row.
func fastRow(l []byte, blockSize int, b *TableBuilder, line int) (ok bool) {
	p := fastParser{b: l}
	if !p.lit('{') {
		return false
	}
	ts, ok1 := p.member("timestamp")
	isl, ok2 := p.member("input_length")
	if !ok1 || !ok2 {
		return false
	}
	p.space()
	osl := int64(-1)
	if p.peek() == ',' {
		save := p.i
		p.i++
		var ok3 bool
		if osl, ok3 = p.key("output_length"); !ok3 {
			p.i = save
			osl = -1
		}
	}
	ids := b.scratch[:0]
	hasIDs := false
	p.space()
	if p.peek() == ',' {
		p.i++
		if !p.keyOnly("hash_ids") || !p.lit('[') {
			return false
		}
		hasIDs = true
		p.space()
		if p.peek() == ']' {
			p.i++
		} else {
			for {
				v, ok := p.int()
				if !ok {
					return false
				}
				ids = append(ids, v)
				p.space()
				if p.peek() == ']' {
					p.i++
					break
				}
				if !p.lit(',') {
					return false
				}
			}
		}
	}
	b.scratch = ids
	if !p.lit('}') {
		return false
	}
	p.space()
	if p.i != len(l) || isl > MaxCount || osl > MaxCount || isl > math.MaxInt32 || osl > math.MaxInt32 || ts > 1<<53 {
		return false
	}
	if blockSize > 0 && len(ids) > 0 {
		n := int64(len(ids))
		if isl < 1 || (isl-1)/int64(blockSize)+1 > n {
			return false
		}
	}
	b.appendPlain(float64(ts), int32(isl), int32(osl), ids, hasIDs, line)
	return true
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *fastParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t') {
		p.i++
	}
}

func (p *fastParser) lit(c byte) bool {
	p.space()
	if p.peek() != c {
		return false
	}
	p.i++
	return true
}

// keyOnly reads `"name":`.
func (p *fastParser) keyOnly(name string) bool {
	p.space()
	if p.i+len(name)+2 > len(p.b) || p.b[p.i] != '"' || string(p.b[p.i+1:p.i+1+len(name)]) != name || p.b[p.i+1+len(name)] != '"' {
		return false
	}
	p.i += len(name) + 2
	return p.lit(':')
}

// key reads `"name": integer`.
func (p *fastParser) key(name string) (int64, bool) {
	if !p.keyOnly(name) {
		return 0, false
	}
	return p.int()
}

// member reads the first or a following `"name": integer`.
func (p *fastParser) member(name string) (int64, bool) {
	if name != "timestamp" && !p.lit(',') {
		return 0, false
	}
	return p.key(name)
}

// int reads a non-negative decimal integer without leading zeros, of at
// most 18 digits.
func (p *fastParser) int() (int64, bool) {
	p.space()
	start := p.i
	var v int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		v = v*10 + int64(p.b[p.i]-'0')
		p.i++
	}
	n := p.i - start
	if n == 0 || n > 18 || (n > 1 && p.b[start] == '0') {
		return 0, false
	}
	// A fraction or exponent is not this shape.
	if c := p.peek(); c == '.' || c == 'e' || c == 'E' {
		return 0, false
	}
	return v, true
}
