package cli

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log/level"
	promconfig "github.com/prometheus/common/config"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/lifecycle"
	"github.com/kvload-exporter/kvload-exporter/openai"
	"github.com/kvload-exporter/kvload-exporter/replay"
	"github.com/kvload-exporter/kvload-exporter/trace"
)

// endpointType is AIPerf's --endpoint-type, of which the exporter speaks
// the two text-generation APIs.
type endpointType string

const (
	endpointChat        endpointType = "chat"
	endpointCompletions endpointType = "completions"
)

// api is the configuration's api for the endpoint type.
func (e endpointType) api() openai.API {
	if e == endpointCompletions {
		return openai.APICompletions
	}
	return openai.APIChat
}

// datasetMooncake is the one --custom-dataset-type the exporter replays.
const datasetMooncake = "mooncake_trace"

// profileDefaultConcurrency bounds the requests in flight when
// --concurrency is not given: AIPerf's fixed schedule has no bound, and the
// exporter's must be a number (rows past it wait their turn).
const profileDefaultConcurrency = 1024

// profileFlags are the profile command's flags: AIPerf's profile flags with
// AIPerf's meaning, and the daemon's own for --serve.
type profileFlags struct {
	model        string
	url          string
	endpointType string
	streaming    bool
	apiKey       string

	inputFile   string
	datasetType string

	fixedSchedule  bool
	autoOffset     bool
	startOffset    int64
	startOffsetSet bool
	endOffset      int64
	endOffsetSet   bool

	requestCount int
	concurrency  int
	requestRate  float64
	randomSeed   uint64
	seedSet      bool
	synthesis    config.Synthesis
	artifactDir  string

	serve       bool
	printConfig bool

	drainTimeout time.Duration
	log          logFlags
	web          *web.FlagConfig
}

// profileCommand is AIPerf's profile: the trace replayed once, AIPerf's
// console table, a JSON export, exit 0. It translates its flags into a
// configuration file and runs the daemon on it, so that --serve turns the
// benchmark into the canary and --print-config shows what runs.
func profileCommand(app *kingpin.Application) command {
	f := &profileFlags{}
	cl := app.Command("profile", "Replay a Mooncake trace once with AIPerf's profile flags and print AIPerf's table of TTFT, inter-token latency, request latency, sequence lengths and throughput; --serve keeps replaying as the daemon, with /metrics.")
	cl.Flag("model", "Model name sent with every request.").Short('m').Required().StringVar(&f.model)
	cl.Flag("url", "Base URL of the server; without a scheme, http.").Short('u').Default("localhost:8000").StringVar(&f.url)
	cl.Flag("endpoint-type", "The API: chat (/v1/chat/completions) or completions (/v1/completions).").Default(string(endpointChat)).EnumVar(&f.endpointType, string(endpointChat), string(endpointCompletions))
	cl.Flag("streaming", "Accepted as AIPerf takes it: the exporter always streams, to measure time to first token.").BoolVar(&f.streaming)
	cl.Flag("api-key", "Sent as a bearer token (written to a file of mode 0600 in the artifact directory, which the configuration names).").StringVar(&f.apiKey)
	cl.Flag("input-file", "The Mooncake trace (JSON lines) to replay.").Required().PlaceHolder("FILE").StringVar(&f.inputFile)
	cl.Flag("custom-dataset-type", "The trace's format; mooncake_trace is the one replayed.").Default(datasetMooncake).EnumVar(&f.datasetType, datasetMooncake)
	cl.Flag("fixed-schedule", "Send each row at its timestamp (the default for a Mooncake trace, as in AIPerf).").BoolVar(&f.fixedSchedule)
	cl.Flag("fixed-schedule-auto-offset", "Shift the timestamps so that the first row sent goes at once (the replay always does).").BoolVar(&f.autoOffset)
	cl.Flag("fixed-schedule-start-offset", "Send only the rows whose timestamp is at least this many milliseconds.").PlaceHolder("MS").IsSetByUser(&f.startOffsetSet).Int64Var(&f.startOffset)
	cl.Flag("fixed-schedule-end-offset", "Send only the rows whose timestamp is at most this many milliseconds.").PlaceHolder("MS").IsSetByUser(&f.endOffsetSet).Int64Var(&f.endOffset)
	cl.Flag("request-count", "Send only the first this many rows (of the window, with the offsets); 0 is all.").Default("0").IntVar(&f.requestCount)
	cl.Flag("concurrency", fmt.Sprintf("The most requests in flight; a row finding them all busy waits for one (default %d).", profileDefaultConcurrency)).Default("0").IntVar(&f.concurrency)
	cl.Flag("request-rate", "Send at this many requests a second (Poisson arrivals) instead of the timestamps.").Default("0").Float64Var(&f.requestRate)
	cl.Flag("random-seed", "Seed of the prompts and arrivals: the same seed sends the same prompts.").IsSetByUser(&f.seedSet).Uint64Var(&f.randomSeed)
	s := &f.synthesis
	cl.Flag("synthesis-speedup-ratio", "Divide the timestamps by this.").Float64Var(&s.SpeedupRatio)
	cl.Flag("synthesis-prefix-len-multiplier", "Scale shared prefixes by this.").Float64Var(&s.PrefixLenMultiplier)
	cl.Flag("synthesis-prefix-root-multiplier", "Spread the requests over this many disjoint prefix trees.").IntVar(&s.PrefixRootMultiplier)
	cl.Flag("synthesis-prompt-len-multiplier", "Scale the unique prompt tokens by this.").Float64Var(&s.PromptLenMultiplier)
	cl.Flag("synthesis-output-len-multiplier", "Scale the output lengths by this.").Float64Var(&s.OutputLenMultiplier)
	cl.Flag("synthesis-max-isl", "Drop rows with more input tokens than this.").IntVar(&s.MaxISL)
	cl.Flag("synthesis-max-osl", "Cap the output lengths at this.").IntVar(&s.MaxOSL)
	cl.Flag("artifact-dir", "Where the configuration, the window's trace and profile_export_aiperf.json go (default artifacts/MODEL-ENDPOINT_TYPE).").PlaceHolder("DIR").StringVar(&f.artifactDir)
	cl.Flag("serve", "Keep replaying as the daemon, with /metrics on --web.listen-address, instead of one pass and a table.").BoolVar(&f.serve)
	cl.Flag("print-config", "Print the equivalent configuration file (YAML) and exit; it is also written to the artifact directory.").BoolVar(&f.printConfig)
	cl.Flag("shutdown.drain-timeout", "On an interrupt, how long requests in flight may take to finish.").Default("30s").DurationVar(&f.drainTimeout)
	cl.Flag("log.level", "Only log messages with the given severity or above: debug, info, warn, error.").Default("warn").EnumVar(&f.log.level, "debug", "info", "warn", "error")
	cl.Flag("log.format", "Output format of log messages: logfmt, json.").Default("logfmt").EnumVar(&f.log.format, "logfmt", "json")
	f.web = kingpinflag.AddFlags(cl, ":9812")
	return command{clause: cl, run: func(ctx context.Context, s streams) error { return runProfile(ctx, f, s) }}
}

// baseURL is --url with http:// when it has no scheme, as AIPerf takes it.
func baseURL(raw string) string {
	if !strings.Contains(raw, "://") {
		return "http://" + raw
	}
	return raw
}

var unsafeNameChars = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// labelName makes s a target or workload name: runs of other characters
// become '-'; empty, it is fallback.
func labelName(s, fallback string) string {
	n := strings.Trim(unsafeNameChars.ReplaceAllString(s, "-"), "-")
	return cmp.Or(n, fallback)
}

// artifactDirOrDefault is --artifact-dir, else artifacts/MODEL-TYPE, as AIPerf names it.
func (f *profileFlags) artifactDirOrDefault() string {
	if f.artifactDir != "" {
		return f.artifactDir
	}
	return filepath.Join("artifacts", strings.ReplaceAll(f.model, "/", "_")+"-"+f.endpointType)
}

// checkFlags refuses what AIPerf would refuse, and what has no meaning here.
func (f *profileFlags) checkFlags() error {
	var errs []error
	if f.requestRate != 0 && f.fixedSchedule {
		errs = append(errs, errors.New("--request-rate and --fixed-schedule exclude each other: a rate replaces the timestamps"))
	}
	if f.requestRate < 0 {
		errs = append(errs, fmt.Errorf("--request-rate must be positive, got %v", f.requestRate))
	}
	if f.concurrency < 0 || f.concurrency > config.MaxInFlightLimit {
		errs = append(errs, fmt.Errorf("--concurrency must be from 1 to %d, got %d", config.MaxInFlightLimit, f.concurrency))
	}
	if f.requestCount < 0 {
		errs = append(errs, fmt.Errorf("--request-count must not be negative, got %d", f.requestCount))
	}
	if f.startOffsetSet && f.startOffset < 0 {
		errs = append(errs, fmt.Errorf("--fixed-schedule-start-offset must not be negative, got %d", f.startOffset))
	}
	if f.endOffsetSet && f.endOffset < 0 {
		errs = append(errs, fmt.Errorf("--fixed-schedule-end-offset must not be negative, got %d", f.endOffset))
	}
	if f.startOffsetSet && f.endOffsetSet && f.endOffset < f.startOffset {
		errs = append(errs, fmt.Errorf("--fixed-schedule-end-offset %d is before --fixed-schedule-start-offset %d", f.endOffset, f.startOffset))
	}
	if (f.startOffsetSet || f.endOffsetSet) && f.requestRate != 0 {
		errs = append(errs, errors.New("the --fixed-schedule offsets select rows by timestamp, which --request-rate does not use"))
	}
	if f.serve && f.requestCount != 0 {
		errs = append(errs, errors.New("--request-count ends a benchmark; --serve replays for ever (use --fixed-schedule-end-offset to replay part of the trace)"))
	}
	return errors.Join(errs...)
}

// windowed tells whether only some rows of the trace are sent.
func (f *profileFlags) windowed() bool {
	return f.startOffsetSet || f.endOffsetSet || f.requestCount > 0
}

// writeWindow writes the rows of the input file that the offsets and
// --request-count select to dir, and returns the file and how many rows
// it holds. A row without a timestamp is a later turn of its session and
// goes with the session's first.
func (f *profileFlags) writeWindow(dir string) (string, int, error) {
	rows, err := trace.ReadFile(f.inputFile, trace.ReadOptions{})
	if err != nil {
		return "", 0, err
	}
	inWindow := func(ts float64) bool {
		return (!f.startOffsetSet || ts >= float64(f.startOffset)) && (!f.endOffsetSet || ts <= float64(f.endOffset))
	}
	keptSessions := map[string]bool{}
	var out []byte
	kept, outside := 0, 0
	for i := range rows {
		r := &rows[i]
		keep := false
		switch {
		case r.Timestamp != nil:
			keep = inWindow(*r.Timestamp)
			if r.SessionID != nil {
				if _, seen := keptSessions[*r.SessionID]; !seen {
					keptSessions[*r.SessionID] = keep
				}
				keep = keptSessions[*r.SessionID]
			}
		case r.SessionID != nil:
			keep = keptSessions[*r.SessionID]
		}
		if keep && f.requestCount > 0 && kept >= f.requestCount {
			keep = false
		}
		if !keep {
			outside++
			continue
		}
		kept++
		out = r.AppendJSON(out)
		out = append(out, '\n')
	}
	if kept == 0 {
		return "", 0, fmt.Errorf("%s: no row is within the window (%s): all %d rows fall outside it", f.inputFile, f.windowText(), outside)
	}
	path := filepath.Join(dir, "profile_input.jsonl")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return "", 0, fmt.Errorf("writing the window's trace: %w", err)
	}
	return path, kept, nil
}

// windowText describes the window for messages.
func (f *profileFlags) windowText() string {
	var parts []string
	if f.startOffsetSet {
		parts = append(parts, fmt.Sprintf("--fixed-schedule-start-offset %d", f.startOffset))
	}
	if f.endOffsetSet {
		parts = append(parts, fmt.Sprintf("--fixed-schedule-end-offset %d", f.endOffset))
	}
	if f.requestCount > 0 {
		parts = append(parts, fmt.Sprintf("--request-count %d", f.requestCount))
	}
	return strings.Join(parts, ", ")
}

// profileConfig is the configuration the flags mean, replaying tracePath.
func (f *profileFlags) profileConfig(tracePath, dir string) (*config.Config, error) {
	target := config.Target{
		Name:  "target",
		URL:   baseURL(f.url),
		Model: f.model,
		API:   endpointType(f.endpointType).api(),
	}
	if u, err := url.Parse(target.URL); err == nil && u.Host != "" {
		target.Name = labelName(u.Host, "target")
	}
	if f.apiKey != "" {
		keyFile := filepath.Join(dir, "api_key")
		if err := os.WriteFile(keyFile, []byte(f.apiKey), 0o600); err != nil {
			return nil, fmt.Errorf("writing the API key's file: %w", err)
		}
		hc := promconfig.DefaultHTTPClientConfig
		hc.Authorization = &promconfig.Authorization{Type: "Bearer", CredentialsFile: keyFile}
		target.HTTPClientConfig = &hc
	}
	abs, err := filepath.Abs(tracePath)
	if err != nil {
		return nil, fmt.Errorf("the trace's path: %w", err)
	}
	base := strings.TrimSuffix(filepath.Base(f.inputFile), filepath.Ext(f.inputFile))
	w := config.Workload{
		Name:        labelName(base, "profile"),
		Trace:       abs,
		Targets:     []string{target.Name},
		Seed:        f.randomSeed,
		Synthesis:   f.synthesis,
		MaxInFlight: cmp.Or(f.concurrency, profileDefaultConcurrency),
		// AIPerf never drops a row: one finding every slot taken waits.
		OnSaturation: replay.SaturationQueue,
		Schedule:     config.Schedule{Rate: f.requestRate},
	}
	if !f.serve {
		w.Loop = replay.LoopOnce
		w.Prompts.Reproducible = f.seedSet
	}
	return &config.Config{Targets: []config.Target{target}, Workloads: []config.Workload{w}}, nil
}

// writeProfileConfig writes the configuration the flags mean to dir, with
// the window's trace when only some rows are sent, checks it as a start
// would, and returns its path and bytes.
func (f *profileFlags) writeProfileConfig(dir string) (string, []byte, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("creating the artifact directory: %w", err)
	}
	tracePath := f.inputFile
	if f.windowed() {
		var err error
		if tracePath, _, err = f.writeWindow(dir); err != nil {
			return "", nil, err
		}
	}
	cfg, err := f.profileConfig(tracePath, dir)
	if err != nil {
		return "", nil, err
	}
	var buf bytes.Buffer
	buf.WriteString("# kvload-exporter profile's flags as a configuration file (kvload-exporter --config.file=THIS).\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(cfg); err != nil {
		return "", nil, fmt.Errorf("writing the configuration: %w", err)
	}
	data := buf.Bytes()
	path := filepath.Join(dir, "kvload.yml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", nil, fmt.Errorf("writing the configuration: %w", err)
	}
	if _, err := config.ParseFile(path, data); err != nil {
		return "", nil, err
	}
	return path, data, nil
}

func runProfile(ctx context.Context, f *profileFlags, s streams) error {
	if err := f.checkFlags(); err != nil {
		return badInput(err)
	}
	// Absolute, so that the configuration names its files wherever it is read.
	dir, err := filepath.Abs(f.artifactDirOrDefault())
	if err != nil {
		return badInput(fmt.Errorf("--artifact-dir: %w", err))
	}
	path, data, err := f.writeProfileConfig(dir)
	if err != nil {
		return badInput(err)
	}
	if f.printConfig {
		_, err := s.stdout.Write(data)
		return err
	}
	if f.serve {
		return runDaemon(ctx, &runFlags{
			configFile:    path,
			telemetryPath: "/metrics",
			drainTimeout:  f.drainTimeout,
			memoryLimit:   -1,
			log:           f.log,
			web:           f.web,
		}, s)
	}
	return profileOnce(ctx, f, path, dir, s)
}

// profileOnce runs the daemon on the configuration at path until its one
// pass is sent and answered, then prints the summary and writes its JSON.
func profileOnce(ctx context.Context, f *profileFlags, path, dir string, s streams) error {
	logger, _, _, err := newLogger(f.log, s.stderr)
	if err != nil {
		return badInput(err)
	}
	reg, coll := newRegistry()
	var rec profileRecords
	finished := make(chan struct{})
	var once sync.Once
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	d := lifecycle.New(lifecycle.Options{
		Logger:         logger,
		ConfigFile:     path,
		DrainTimeout:   f.drainTimeout,
		Collector:      coll,
		ResultObserved: rec.add,
		// One workload on one target: its end is the benchmark's.
		ReplayFinished: func(string, string) { once.Do(func() { close(finished) }) },
	})
	started := time.Now()
	if err := d.Start(runCtx); err != nil {
		if errors.Is(err, lifecycle.ErrShuttingDown) {
			return errors.New("interrupted before the replay started")
		}
		return badInput(err)
	}
	level.Info(logger).Log("msg", "profiling", "config", path)
	interrupted := false
	select {
	case <-finished:
	case <-ctx.Done():
		interrupted = true
	}
	stop()
	<-d.Done()
	_, dropped, _ := landingCounters(reg)
	var droppedRows float64
	for _, n := range dropped {
		droppedRows += n
	}
	sum := rec.summary(started, time.Now(), int(droppedRows))
	if err := sum.writeTable(s.stdout); err != nil {
		return fmt.Errorf("writing the summary: %w", err)
	}
	export := filepath.Join(dir, "profile_export_aiperf.json")
	if err := sum.writeJSON(export, f, path); err != nil {
		return err
	}
	fmt.Fprintf(s.stdout, "JSON Export: %s\nConfiguration: %s (kvload-exporter --config.file=%s, or profile --serve, replays it as the daemon)\n", export, path, path)
	switch {
	case interrupted:
		return errors.New("interrupted: the summary covers the requests finished so far")
	case sum.succeeded == 0 && sum.failed > 0:
		return fmt.Errorf("every request to %s failed, such as: %s", baseURL(f.url), sum.firstError)
	}
	return nil
}
