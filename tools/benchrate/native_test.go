package main

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

func TestAddNative(t *testing.T) {
	span := func(offset int32, length uint32) *dto.BucketSpan {
		return &dto.BucketSpan{Offset: proto.Int32(offset), Length: proto.Uint32(length)}
	}
	tests := []struct {
		name string
		h    *dto.Histogram
		want map[float64]float64
	}{
		{"classic only", &dto.Histogram{}, map[float64]float64{}},
		{"two spans, schema 0", &dto.Histogram{
			Schema:        proto.Int32(0),
			ZeroThreshold: proto.Float64(1e-6),
			ZeroCount:     proto.Uint64(4),
			PositiveSpan:  []*dto.BucketSpan{span(-3, 2), span(1, 1)},
			PositiveDelta: []int64{2, 1, -1},
		}, map[float64]float64{1e-6: 4, 0.125: 2, 0.25: 3, 1: 2}},
		{"negative values count at the zero threshold, schema 1", &dto.Histogram{
			Schema:        proto.Int32(1),
			ZeroThreshold: proto.Float64(1e-6),
			NegativeSpan:  []*dto.BucketSpan{span(0, 1)},
			NegativeDelta: []int64{3},
			PositiveSpan:  []*dto.BucketSpan{span(2, 1)},
			PositiveDelta: []int64{5},
		}, map[float64]float64{1e-6: 3, 2: 5}},
		{"fewer deltas than the spans say", &dto.Histogram{
			Schema:        proto.Int32(0),
			PositiveSpan:  []*dto.BucketSpan{span(0, 3)},
			PositiveDelta: []int64{1},
		}, map[float64]float64{1: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[float64]float64{}
			addNative(got, tt.h)
			if len(got) != len(tt.want) {
				t.Fatalf("buckets %v, want %v", got, tt.want)
			}
			for le, c := range tt.want {
				if got[le] != c {
					t.Errorf("bucket le %g: %g, want %g (all: %v)", le, got[le], c, got)
				}
			}
		})
	}
}

// TestQuantileOfNative checks the percentile of cumulative native buckets
// against values whose rank falls inside a bucket.
func TestQuantileOfNative(t *testing.T) {
	counts := map[float64]float64{}
	addNative(counts, &dto.Histogram{
		Schema:        proto.Int32(0),
		PositiveSpan:  []*dto.BucketSpan{{Offset: proto.Int32(-10), Length: proto.Uint32(2)}},
		PositiveDelta: []int64{50, 0}, // 50 in (2^-11, 2^-10], 50 in (2^-10, 2^-9]
	})
	bs := sortedBuckets(counts)
	bs[1].count += bs[0].count
	// Rank 99 is 49/50 of the way through the second bucket.
	want := 1.0/1024 + (1.0/512-1.0/1024)*49/50
	if got := quantile(bs, 0.99).Seconds(); got < want*0.999 || got > want*1.001 {
		t.Errorf("p99 %g s, want %g", got, want)
	}
}
