package replay

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvload-exporter/kvload-exporter/internal/rng"
	"github.com/kvload-exporter/kvload-exporter/synth"
)

// Arrivals is synth.Arrivals, the one arrival-process type, under the
// schedule's name: how an open-loop rate spaces the requests of a pass.
type Arrivals = synth.Arrivals

// The arrival processes of schedule.arrivals, as synth defines them.
const (
	ArrivalsPoisson  = synth.ArrivalsPoisson
	ArrivalsConstant = synth.ArrivalsConstant
)

// The bounds of Schedule.Rate, in requests a second: one an hour at least,
// and no faster than a dispatcher can place requests a microsecond apart.
const (
	MinRate = 1.0 / 3600
	MaxRate = 1e6
)

// MaxUsers bounds Schedule.Users: each user holds a request in flight,
// with its goroutine, connection and buffers.
const MaxUsers = 1 << 16

// streamArrivals names the random stream of Poisson arrivals under the
// workload's seed, apart from synthesis's and the prompts'.
const streamArrivals = "schedule.arrivals"

// closedNominalRate places the conversations of a closed-loop schedule on
// the nominal time axis that the theoretical cache model and the pass grid
// use; the users themselves never wait for it.
const closedNominalRate = 1.0

// Schedule replaces the trace's timestamps with generated arrivals. The
// zero value keeps the trace's own (AIPerf's fixed schedule).
//
// With Rate, requests arrive at Rate a second for the whole fleet (every
// shard together), evenly (ArrivalsConstant) or as a Poisson process. A
// conversation of T turns takes T arrivals: its first turn goes at the
// first of them, and its later turns follow their predecessor's end after
// their delay, as with a fixed schedule, so that a pass averages Rate
// requests a second whatever the sessions. The arrivals of a pass are a
// function of the seed: every pass and every replica has the same ones.
// A Poisson pass is scaled to last exactly its requests / Rate (the
// process conditioned on its count), so a pass keeps the rate asked.
//
// With Users, the schedule is a closed loop: Users users each take the
// next conversation not yet started, send its turns in order (a later turn
// after its delay, or ThinkTime when it has none) and, once its last turn
// ended, wait ThinkTime before taking the next conversation.
//
// Either way later turns never have timestamps of their own, and
// conversations keep the trace's order: by first-turn timestamp where
// every conversation has one, else by first appearance in the file.
type Schedule struct {
	Rate      float64  // requests a second; 0: no open-loop rate
	Arrivals  Arrivals // with Rate; "" means ArrivalsPoisson
	Users     int      // closed-loop users; 0: open loop
	ThinkTime time.Duration
	Seed      uint64 // the root of the Poisson draws
}

// fixed tells whether the schedule is the trace's own timestamps.
func (s Schedule) fixed() bool { return s.Rate == 0 && s.Users == 0 }

// Closed tells whether the schedule is a closed loop of users.
func (s Schedule) Closed() bool { return s.Users > 0 }

// Validate reports every rule the schedule breaks at once, naming each
// key as the configuration spells it (rate, users, ...).
func (s Schedule) Validate() error {
	return s.ValidateNamed(func(key string) string { return cmp.Or(key, "schedule") })
}

// ValidateNamed is Validate with each key named by name(key), "" naming
// the schedule as a whole, so that a configuration file can say its YAML
// path: each problem is name(key), a space, and the reason.
func (s Schedule) ValidateNamed(name func(key string) string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s", name(key), fmt.Sprintf(format, args...)))
	}
	if s.Rate != 0 && !(s.Rate >= MinRate && s.Rate <= MaxRate) {
		bad("rate", "must be from 1/3600 (one an hour) to %d requests a second, got %v", int(MaxRate), s.Rate)
	}
	if s.Users < 0 || s.Users > MaxUsers {
		bad("users", "must be from 0 to %d, got %d", MaxUsers, s.Users)
	}
	if s.Rate != 0 && s.Users != 0 {
		bad("", "rate (an open loop) and users (a closed loop) exclude each other")
	}
	arrivalsErr := s.Arrivals.Validate()
	switch {
	case s.Arrivals != "" && s.Rate == 0:
		bad("arrivals", "applies only with a rate")
	case arrivalsErr != nil:
		bad("arrivals", "%v", arrivalsErr)
	}
	switch {
	case s.ThinkTime < 0:
		bad("think_time", "must not be negative")
	case s.ThinkTime != 0 && s.Users == 0:
		bad("think_time", "applies only with users")
	}
	return errors.Join(errs...)
}

// String describes the schedule for a log line.
func (s Schedule) String() string {
	switch {
	case s.Closed():
		return fmt.Sprintf("closed loop of %d users, think time %v", s.Users, s.ThinkTime)
	case s.Rate > 0:
		return fmt.Sprintf("%s arrivals at %g requests/s", s.Arrivals.OrDefault(), s.Rate)
	}
	return "trace timestamps"
}

// placeArrivals gives the conversations of a pass generated due times
// in place of the trace's timestamps, and sets the pass length: the
// arrivals of all the pass's requests at the schedule's rate.
func (p *Plan) placeArrivals() error {
	rows := p.rows
	timed := true
	for _, c := range p.convs {
		if _, ok := rows.Timestamp(int(c.first)); !ok {
			timed = false
			break
		}
	}
	if timed {
		slices.SortStableFunc(p.convs, func(a, b pacerConv) int {
			ta, _ := rows.Timestamp(int(a.first))
			tb, _ := rows.Timestamp(int(b.first))
			return cmp.Compare(ta, tb)
		})
	}
	rate := p.sched.Rate
	if p.sched.Closed() {
		rate = closedNominalRate
	}
	n := rows.Len()
	seconds := float64(n) / rate
	if seconds*1e9 > float64(math.MaxInt64/4) {
		return fmt.Errorf("pacer: %d requests at %g a second make a pass too long to schedule", n, rate)
	}
	gap := p.arrivalGaps(n)
	at := 0.0 // in arrivals: the slot of the next conversation
	for k := range p.convs {
		p.convs[k].due = time.Duration(math.Round(at / rate * 1e9))
		for range p.convs[k].turns {
			at += gap()
		}
	}
	p.period = max(time.Duration(math.Round(seconds*1e9)), 1)
	return nil
}

// arrivalGaps returns the gaps between n arrivals and after the last, in
// units of the mean gap: all 1 for constant arrivals; for Poisson ones,
// exponential draws scaled so that the n of them sum to exactly n. The
// sum is taken over a first run of the seeded stream, which the gaps then
// draw again, so that no array of n gaps is held.
func (p *Plan) arrivalGaps(n int) func() float64 {
	if p.sched.Closed() || p.sched.Arrivals == ArrivalsConstant {
		return func() float64 { return 1 }
	}
	r := rng.New(p.sched.Seed, streamArrivals)
	sum := 0.0
	for range n {
		sum += r.ExpFloat64()
	}
	scale := float64(n) / sum
	r = rng.New(p.sched.Seed, streamArrivals)
	return func() float64 { return r.ExpFloat64() * scale }
}

// timedTurn tells whether row i, a later turn, goes at its own timestamp
// rather than after its predecessor: never with a generated schedule.
func (p *Plan) timedTurn(i int) bool {
	if !p.sched.fixed() {
		return false
	}
	_, ok := p.rows.Timestamp(i)
	return ok
}
