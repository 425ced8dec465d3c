package lifecycle

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/go-kit/log/level"
	promconfig "github.com/prometheus/common/config"
	"golang.org/x/sync/errgroup"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
)

// serverScrapeInterval is how often a server_metrics target's /metrics is
// read. The increase between two scrapes is credited to the workloads that
// sent prompts in between. A scrape ends within serverScrapeTimeout,
// below the interval, so that a target that hangs or drips its page costs
// one counted timeout per scrape and delays no other; its answer's head
// must come within serverScrapeHeaderTimeout.
const (
	serverScrapeInterval      = 5 * time.Second
	serverScrapeTimeout       = 4 * time.Second
	serverScrapeHeaderTimeout = 3 * time.Second
)

// scraping is a running server-metrics scraper of one target.
type scraping struct {
	fingerprint string
	reconcile   bool // its reads feed the collector's comparison
	cancel      context.CancelFunc
	done        chan struct{}
}

// scrapedTargets are the targets of cfg whose engine counters are read,
// by name: with observed: server_metrics, or cache.reconcile on.
func scrapedTargets(cfg *config.Config) map[string]*config.Target {
	want := map[string]*config.Target{}
	for i := range cfg.Targets {
		if t := &cfg.Targets[i]; engineReadsOf(t).wanted() {
			want[t.Name] = t
		}
	}
	return want
}

// scraperSet is the part that runs one server-metrics scraper per target
// whose engine counters are read.
type scraperSet struct {
	*common
	emulators *emulatorSet
	running   map[string]*scraping
}

func newScraperSet(c *common, emulators *emulatorSet) *scraperSet {
	return &scraperSet{common: c, emulators: emulators, running: map[string]*scraping{}}
}

// fingerprint is what a scraper of t is restarted on a change of.
func (s *scraperSet) fingerprint(cfg *config.Config, t *config.Target) string {
	return cfg.Fingerprint("target", t.Name) + "\x00" + s.emulators.url(t.Name)
}

// stop stops the scrapers of targets that next changed, removed or no
// longer scrapes (all of them when next is nil) and waits for their end,
// so that none counts anything for its target after that.
func (s *scraperSet) stop(next *nextConfig) {
	want := map[string]*config.Target{}
	if next != nil {
		want = scrapedTargets(next.cfg)
	}
	stopped := map[string]*scraping{}
	for name, sc := range s.running {
		if t := want[name]; t == nil || s.fingerprint(next.cfg, t) != sc.fingerprint {
			sc.cancel() // every one before waiting for any
			stopped[name] = sc
		}
	}
	for name, sc := range stopped {
		<-sc.done
		delete(s.running, name)
		if sc.reconcile {
			s.coll.Reconcile().Stop(name)
		}
	}
}

// apply runs one scraper per target whose engine counters are read
// (observed: server_metrics, cache.reconcile) that has none (stop
// stops those no longer wanted). The baselines of server_metrics are
// read first, at most maxTargetReads at once, each within
// discoverTimeout; they end when ctx does (the shutdown), and then no
// scraper starts and ctx's error is returned. The scrapers run under
// unitCtx, through the drain, until stop or a reload stops them.
func (s *scraperSet) apply(ctx, unitCtx context.Context, next *nextConfig) error {
	cfg := next.cfg
	s.stop(next)
	type started struct {
		name string
		t    *config.Target
		sc   *engine.ServerScraper
		sink *engineReadSink
	}
	var todo []started
	for name, t := range scrapedTargets(cfg) {
		if s.running[name] != nil {
			continue
		}
		url := t.EngineMetricsURL()
		if t.Emulate != nil && url == "" {
			url = s.emulators.url(name) + "/metrics"
		}
		sc, err := newServerScraper(t, url)
		if err != nil {
			return err
		}
		reads := engineReadsOf(t)
		if !reads.credit {
			// Nothing waits for a comparison's baseline: its first read
			// takes it, one interval on.
			sc.FirstAfter = serverScrapeInterval
		}
		todo = append(todo, started{name, t, sc, &engineReadSink{target: name, reads: reads, credit: s.truth, comp: s.coll.Reconcile(), logger: s.logger}})
	}
	// The baselines come before the targets' first requests.
	var primes errgroup.Group
	primes.SetLimit(maxTargetReads)
	for _, st := range todo {
		if !st.sink.reads.credit {
			continue
		}
		primes.Go(func() error {
			if ctx.Err() != nil {
				return nil
			}
			pctx, pcancel := context.WithTimeout(ctx, discoverTimeout)
			defer pcancel()
			if err := st.sc.Prime(pctx); err != nil {
				level.Warn(s.logger).Log("msg", "server metrics: no baseline before the first request; hits until the first good scrape are not counted", "target", st.name, "err", err)
			}
			return nil
		})
	}
	_ = primes.Wait() // each logs its own failure
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, st := range todo {
		ctx, cancel := context.WithCancel(unitCtx)
		sc := &scraping{fingerprint: s.fingerprint(cfg, st.t), reconcile: st.sink.reads.reconcile, cancel: cancel, done: make(chan struct{})}
		s.running[st.name] = sc
		if sc.reconcile {
			s.coll.Reconcile().Start(st.name)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer close(sc.done)
			st.sc.Run(ctx, st.sink, st.sink.failed)
		}()
	}
	return nil
}

// newServerScraper is the scraper of t's counter at url.
func newServerScraper(t *config.Target, url string) (*engine.ServerScraper, error) {
	client, err := targetHTTPClient(t, "kvload_server_metrics")
	if err != nil {
		return nil, fmt.Errorf("target %s: server metrics client: %w", t.Name, err)
	}
	return &engine.ServerScraper{Target: t.Name, URL: url, Dialect: t.Dialect, Client: client,
		Interval: serverScrapeInterval, Timeout: serverScrapeTimeout, HeaderTimeout: serverScrapeHeaderTimeout}, nil
}

// targetHTTPClient is a client with t's http_client_config for what the
// exporter reads from t besides its requests. Like the request client it
// never follows a redirect, which could carry t's credentials elsewhere.
func targetHTTPClient(t *config.Target, name string) (*http.Client, error) {
	c, err := promconfig.NewClientFromConfig(*t.HTTPClientConfig, name)
	if err != nil {
		return nil, err
	}
	engine.NoRedirects(c)
	return c, nil
}
