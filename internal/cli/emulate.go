package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"

	"github.com/kvload-exporter/kvload-exporter/emulate"
)

// emulateCommand runs the OpenAI-compatible engine emulator until the
// process is signaled, so the exporter can be tried without a GPU.
func emulateCommand(app *kingpin.Application) command {
	cl := app.Command("emulate", "Serve an emulated OpenAI-compatible inference engine with vLLM's API shapes and a prefix cache imitating vLLM, SGLang, TensorRT-LLM or llama.cpp (no GPU needed).")
	var listen string
	cfg := emulate.DefaultConfig()
	f := &cfg.Faults
	cl.Flag("listen", "Address to listen on (host:port; port 0 picks one).").Default("127.0.0.1:8000").StringVar(&listen)
	cl.Flag("model", "Served model name.").Default(cfg.Model).StringVar(&cfg.Model)
	cl.Flag("max-model-len", "Context window in tokens: prompt plus output beyond it is rejected.").Default(fmt.Sprint(cfg.MaxModelLen)).IntVar(&cfg.MaxModelLen)
	cl.Flag("engine", "Engine to imitate: vllm, sglang, trtllm or llamacpp (cache granularity, metric names, capacity endpoints).").Default("vllm").SetValue(&cfg.Engine)
	cl.Flag("block-size", "Prefix cache block size in tokens; 0 is the engine's default (vllm 16, sglang 1, trtllm 32, llamacpp 1).").Default("0").IntVar(&cfg.BlockSize)
	cl.Flag("capacity-blocks", "Prefix cache capacity in blocks, least recently used evicted first; 0 is unbounded (not for llamacpp, see --slots).").Default("0").IntVar(&cfg.CapacityBlocks)
	cl.Flag("slots", "llamacpp only: slots, each remembering its last prompt; 0 is 1.").Default("0").IntVar(&cfg.Slots)
	cl.Flag("cache-ram-tokens", fmt.Sprintf("llamacpp only: the host prompt cache that keeps idle slots' prompts (llama-server's --cache-ram), in tokens; 0 is %d, --cache-ram-tokens=-1 turns it off.", emulate.DefaultCacheRAMTokens)).Default("0").IntVar(&cfg.CacheRAMTokens)
	cl.Flag("hide-cache-config", "vllm and sglang: do not export the cache's capacity (vllm:cache_config_info, /get_server_info), as an engine whose capacity cannot be read.").BoolVar(&cfg.HideCacheConfig)
	cl.Flag("bos", "Prepend a BOS token to every text prompt, as Llama tokenizers do.").BoolVar(&cfg.BOS)
	cl.Flag("disable-prefix-cache", "Start with the prefix cache off (POST /emulator/cache turns it on).").BoolVar(&cfg.DisablePrefixCache)
	cl.Flag("omit-cached-tokens", "Send prompt_tokens_details null, like vLLM without --enable-prompt-tokens-details.").BoolVar(&cfg.OmitCachedTokens)
	cl.Flag("kv-events", "Publish the prefix cache's KV events (blocks stored and removed, cache cleared) in vLLM's wire format on a ZMQ PUB socket at this endpoint, tcp://host:port (port 0 picks one); not for llamacpp.").PlaceHolder("tcp://127.0.0.1:5557").StringVar(&cfg.KVEvents)
	cl.Flag("kv-events-topic", "Topic frame of every KV event message (vLLM's default is empty).").StringVar(&cfg.KVEventsTopic)
	cl.Flag("kv-events-format", "How each KV event is encoded: map (vLLM's tagged maps, the default) or array (its older tagged arrays).").Default("map").StringVar((*string)(&cfg.KVEventsFormat))
	cl.Flag("kv-events-replay-endpoint", "With --kv-events: serve replays of the last 10,000 event batches on a ZMQ ROUTER socket at this endpoint, as vLLM's replay_endpoint does (its layout since v0.26.0).").PlaceHolder("tcp://127.0.0.1:5558").StringVar(&cfg.KVEventsReplayEndpoint)
	cl.Flag("kv-events-drop", "With --kv-events: the share of event batches, 0 to 1, not sent to subscribers (kept for the replay), as a publisher past its high-water mark drops them.").Default("0").Float64Var(&cfg.KVEventsDrop)
	cl.Flag("metrics-double-count-hits", "Count every cache hit twice in the /metrics hit counter (its prompt-token counters stay right), as vLLM did on a retried admission; usage stays true.").BoolVar(&cfg.MetricsDoubleCountHits)
	cl.Flag("metrics-hits-overcount", "Share of the cache hits that the /metrics hit counter (vllm:prefix_cache_hits_total) counts once more, as vLLM's counts a preempted request's lookups again; vLLM's per-request cached counts, and usage, stay true.").Default("0").Float64Var(&cfg.MetricsHitsOvercount)
	cl.Flag("max-running", fmt.Sprintf("Sequences running at once; later requests queue. 0 is %d, or --slots for llamacpp.", emulate.DefaultMaxRunning)).Default("0").IntVar(&cfg.MaxRunning)
	cl.Flag("overhead", "Fixed part of the time to first token.").Default(cfg.Overhead.String()).DurationVar(&cfg.Overhead)
	cl.Flag("prefill-per-token", "Time to first token added per prompt token not in the prefix cache.").Default(cfg.PrefillPerToken.String()).DurationVar(&cfg.PrefillPerToken)
	cl.Flag("inter-token", "Time between output tokens.").Default(cfg.InterToken.String()).DurationVar(&cfg.InterToken)
	cl.Flag("seed", "Seed of the fault draws.").Default("0").Uint64Var(&cfg.Seed)
	cl.Flag("error-rate", "Probability of an HTTP 500.").Default("0").Float64Var(&f.Error500)
	cl.Flag("rate-limit-rate", "Probability of an HTTP 429.").Default("0").Float64Var(&f.Error429)
	cl.Flag("disconnect-rate", "Probability of closing the connection mid-response.").Default("0").Float64Var(&f.Disconnect)
	cl.Flag("malformed-rate", "Probability of a malformed chunk ending the stream.").Default("0").Float64Var(&f.Malformed)
	cl.Flag("hang-rate", "Probability of sending headers and then nothing until the client leaves.").Default("0").Float64Var(&f.Hang)
	cl.Flag("slow-first-token-rate", "Probability of adding --slow-first-token-delay to the prefill.").Default("0").Float64Var(&f.SlowFirstToken)
	cl.Flag("slow-first-token-delay", "Extra time to first token of the slow-first-token fault.").Default(emulate.DefaultSlowFirstTokenDelay.String()).DurationVar(&f.SlowFirstTokenDelay)
	cl.Flag("fault-after-tokens", "Output tokens sent before a disconnect or malformed fault; 0 is half the output.").Default("0").IntVar(&f.AfterTokens)
	return command{clause: cl, run: func(ctx context.Context, s streams) error {
		return runEmulate(ctx, s, listen, cfg)
	}}
}

// runEmulate serves until ctx ends (SIGINT or SIGTERM in main).
func runEmulate(ctx context.Context, s streams, listen string, cfg emulate.Config) error {
	e, err := emulate.New(cfg)
	if err != nil {
		return badInput(err)
	}
	// Its other lines are written here, in the same form.
	e.LogTo(log.NewLogfmtLogger(log.NewSyncWriter(s.stderr)))
	base, wait, err := e.Start(ctx, listen)
	if err != nil {
		// As the daemon: an address that cannot be bound is bad input
		// (exit 2). The emulate package names itself.
		return badInput(err)
	}
	c := e.Config()
	// The URL is the first line, so scripts and tests can read it.
	fmt.Fprintf(s.stderr, "level=info msg=\"emulator listening\" url=%s model=%s engine=%s block_size=%d capacity_blocks=%d slots=%d cache_ram_tokens=%d max_running=%d overhead=%s prefill_per_token=%s inter_token=%s\n",
		base, c.Model, c.Engine, c.BlockSize, c.CapacityBlocks, c.Slots, c.CacheRAMTokens, c.MaxRunning, c.Overhead, c.PrefillPerToken, c.InterToken)
	if ep := e.KVEventsEndpoint(); ep != "" {
		fmt.Fprintf(s.stderr, "level=info msg=\"emulator publishing KV events\" endpoint=%s topic=%q format=%s replay_endpoint=%q drop=%v\n", ep, c.KVEventsTopic, c.KVEventsFormat,
			e.KVEventsReplayEndpoint(), c.KVEventsDrop)
	}
	start := time.Now()
	err = wait()
	st := e.Stats()
	fmt.Fprintf(s.stderr, "level=info msg=\"emulator stopped\" uptime=%s success=%d cache_query_tokens=%d cache_hit_tokens=%d\n",
		time.Since(start).Round(time.Millisecond), st.Success, st.CacheQueryTokens, st.CacheHitTokens)
	return err
}
