package lifecycle

import (
	"fmt"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/engine"
	"github.com/kvload-exporter/kvload-exporter/replay"
)

// unitCacheModel is the cache model of a unit on target t. Where the
// target's responses carry its observed cached tokens (observed: usage),
// their answers decide whether the rows the model assumes sent before its
// start reached the engine, and the decision is logged (once, unless later
// answers take it back). With
// observed: server_metrics no answer says what one request hit, and the
// hits resting on those rows stay unknown until they are sent again.
func unitCacheModel(pacer *replay.Pacer, params replay.CacheParams, t *config.Target, logger log.Logger) *replay.CacheModel {
	m := replay.NewCacheModel(pacer, params)
	if t.Cache.Observed != engine.ObservedUsage {
		return m
	}
	m.LearnWarmUp(func(d replay.WarmUpDecision) {
		msg, means := "warm-up decided from the engine's answers", ""
		switch d.World {
		case replay.WarmUpWarm:
			means = "the engine holds what the exporter assumed sent before its start: it counts as sent"
		case replay.WarmUpCold:
			means = "the engine lacks what the exporter assumed sent before its start: only what was sent since counts"
		case replay.WarmUpPartial:
			means = "the engine holds what the fleet sent from a point before the exporter's start on, as after a replica that ran for part of a pass: that counts as sent, the rows before it do not"
		default:
			msg = "warm-up undecided again: the engine's answers are mixed"
			means = "hits resting on what the exporter assumed sent before its start are unknown until those rows are sent again"
		}
		level.Info(logger).Log("msg", msg, "world", d.World, "means", means, "answers_warm", d.Warm, "answers_cold", d.Cold,
			"answers_partial", d.Partial, "warm_share", fmt.Sprintf("%.3f", d.WarmShare), "agreeing_share", fmt.Sprintf("%.3f", d.Agreeing),
			"answers_between", d.Abstained)
	})
	return m
}
