package main

import (
	"context"
	"errors"

	"github.com/alecthomas/kingpin/v2"
)

// analyzeCommand is a placeholder until the command is written.
func analyzeCommand(app *kingpin.Application) command {
	cl := app.Command("analyze", "not written yet")
	return command{clause: cl, run: func(context.Context, streams) error {
		return errors.New("analyze: not implemented")
	}}
}
