//go:build !linux || race

package openai

import "github.com/prometheus/common/config"

// transportOptions: plain connections (see quietconn_linux.go).
func transportOptions() []config.HTTPClientOption { return nil }
