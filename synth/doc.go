// Package synth computes on whole traces: statistics (Analyze), the AIPerf
// transform (Transform) and the Dynamo-style generator (Generate). It is
// pure: no clocks, no network.
package synth
