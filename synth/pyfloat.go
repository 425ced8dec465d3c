package synth

import (
	"math"
	"strconv"
)

// FormatPyFloat formats x as Python's repr(float) does, which is how the
// reference tools print full-precision statistics: the shortest digits that
// read back as x, in positional notation with at least one fractional digit
// ("891.0", "0.0001") when the decimal exponent is in [-4, 16), otherwise
// in scientific notation with a signed two-digit-minimum exponent ("1e-05",
// "1.5e+16").
func FormatPyFloat(x float64) string {
	return string(AppendPyFloat(nil, x))
}

// AppendPyFloat appends FormatPyFloat(x) to b.
func AppendPyFloat(b []byte, x float64) []byte {
	switch {
	case math.IsNaN(x):
		return append(b, "nan"...)
	case math.IsInf(x, 1):
		return append(b, "inf"...)
	case math.IsInf(x, -1):
		return append(b, "-inf"...)
	}
	// Go's shortest round-trip digits are the ones Python picks too; only
	// the layout differs. 'e' gives "-d.ddde±XX".
	var tmp [32]byte
	s := strconv.AppendFloat(tmp[:0], x, 'e', -1, 64)
	if s[0] == '-' {
		b = append(b, '-')
		s = s[1:]
	}
	ePos := 0
	for s[ePos] != 'e' {
		ePos++
	}
	exp, _ := strconv.Atoi(string(s[ePos+1:])) // strconv wrote it; it parses
	var digits [24]byte
	nd := 0
	for _, c := range s[:ePos] {
		if c != '.' {
			digits[nd] = c
			nd++
		}
	}
	d := digits[:nd]

	if exp < -4 || exp >= 16 {
		b = append(b, d[0])
		if len(d) > 1 {
			b = append(b, '.')
			b = append(b, d[1:]...)
		}
		b = append(b, 'e')
		if exp < 0 {
			b = append(b, '-')
			exp = -exp
		} else {
			b = append(b, '+')
		}
		if exp < 10 {
			b = append(b, '0')
		}
		return strconv.AppendInt(b, int64(exp), 10)
	}

	point := exp + 1 // digits before the decimal point
	switch {
	case point <= 0:
		b = append(b, "0."...)
		for range -point {
			b = append(b, '0')
		}
		b = append(b, d...)
	case point >= len(d):
		b = append(b, d...)
		for range point - len(d) {
			b = append(b, '0')
		}
		b = append(b, ".0"...)
	default:
		b = append(b, d[:point]...)
		b = append(b, '.')
		b = append(b, d[point:]...)
	}
	return b
}
