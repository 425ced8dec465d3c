//go:build !linux || race

package openai

import (
	"context"
	"net"

	"github.com/prometheus/common/config"
)

// transportOptions: plain connections (see quietconn_linux.go).
func transportOptions() []config.HTTPClientOption { return nil }

// dialEngine dials an engine's connection for the fast sender.
func dialEngine(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
