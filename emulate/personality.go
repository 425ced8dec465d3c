package emulate

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Personality is the inference engine the emulator imitates: it decides
// the prefix cache's granularity and what the engine reports about it
// (metric names, capacity endpoints, timings).
type Personality int

// Personalities. The zero value is vLLM, the emulator's original shape.
const (
	// PersonalityVLLM caches full blocks (16 tokens by default) and hits
	// whole blocks only; it exports vllm:* metrics and
	// vllm:cache_config_info.
	PersonalityVLLM Personality = iota
	// PersonalitySGLang is a token-granular radix cache (page size 1); it
	// exports sglang:* metrics and GET /get_server_info.
	PersonalitySGLang
	// PersonalityTRTLLM caches 32-token blocks with partial reuse: a hit
	// may end inside a cached block.
	PersonalityTRTLLM
	// PersonalityLlamaCpp keeps one prompt per slot and a host prompt
	// cache behind the slots; it exports llamacpp:* metrics, GET /props
	// and timings.cache_n.
	PersonalityLlamaCpp
)

var personalityNames = [...]string{
	PersonalityVLLM:     "vllm",
	PersonalitySGLang:   "sglang",
	PersonalityTRTLLM:   "trtllm",
	PersonalityLlamaCpp: "llamacpp",
}

func (p Personality) String() string {
	if p >= 0 && int(p) < len(personalityNames) {
		return personalityNames[p]
	}
	return fmt.Sprintf("Personality(%d)", int(p))
}

// ParsePersonality reads a personality name; the empty string is vLLM.
func ParsePersonality(s string) (Personality, error) {
	if s == "" {
		return PersonalityVLLM, nil
	}
	for p, name := range personalityNames {
		if s == name {
			return Personality(p), nil
		}
	}
	return 0, fmt.Errorf("unknown engine %q (want vllm, sglang, trtllm or llamacpp)", s)
}

// MarshalText writes the name, so YAML and JSON carry "sglang", not 1.
func (p Personality) MarshalText() ([]byte, error) {
	if p < 0 || int(p) >= len(personalityNames) {
		return nil, fmt.Errorf("invalid engine %d", int(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText reads a name (yaml.v3 and encoding/json use it).
func (p *Personality) UnmarshalText(b []byte) error {
	v, err := ParsePersonality(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// UnmarshalYAML reads a name as UnmarshalText does, but tells an unknown
// one as a type error at its line: a decoder then goes on, and a file's
// other problems are reported with it.
func (p *Personality) UnmarshalYAML(n *yaml.Node) error {
	var name string
	if err := n.Decode(&name); err != nil {
		return err
	}
	v, err := ParsePersonality(name)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*p = v
	return nil
}

// Set and the String above make *Personality a flag value (kingpin's
// Value interface), so the emulate command can take --engine.
func (p *Personality) Set(s string) error { return p.UnmarshalText([]byte(s)) }

// saltUse is what an engine does with a request's cache_salt on a route.
type saltUse int

const (
	// saltKept: requests of different salts share no cached prefix.
	saltKept saltUse = iota
	// saltIgnored: the route has no such field and ignores it.
	saltIgnored
	// saltRefused: the route has no such field and refuses the request,
	// as it refuses any unknown field.
	saltRefused
)

// cacheSalt is what the engine does with cache_salt on chat or
// completions. vLLM and SGLang keep salts apart on both. TensorRT-LLM's
// chat request has the field; its completions request has not, and
// refuses unknown fields. llama-server has no such field: its slots serve
// every client alike.
func (p Personality) cacheSalt(chat bool) saltUse {
	switch {
	case p == PersonalityLlamaCpp:
		return saltIgnored
	case p == PersonalityTRTLLM && !chat:
		return saltRefused
	}
	return saltKept
}

// defaultBlockSize is the cache granularity each engine uses by default:
// vLLM's 16-token blocks, SGLang's page size 1, TensorRT-LLM's 32 tokens
// per block. llama.cpp matches tokens one by one within a slot.
func (p Personality) defaultBlockSize() int {
	switch p {
	case PersonalitySGLang, PersonalityLlamaCpp:
		return 1
	case PersonalityTRTLLM:
		return 32
	}
	return DefaultBlockSize
}
