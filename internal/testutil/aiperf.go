package testutil

// AIPerfDocRows are the example rows of AIPerf's trace-replay
// documentation: the format's example, whose 655 tokens fill two of its
// three 512-token blocks, and the custom trace.
const AIPerfDocRows = `{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 1200, "output_length": 52, "hash_ids": [0, 1, 2]}
{"timestamp": 105, "input_length": 1800, "output_length": 26, "hash_ids": [0, 3, 4, 5]}
{"timestamp": 274, "input_length": 1300, "output_length": 52, "hash_ids": [1, 4, 6]}
`
