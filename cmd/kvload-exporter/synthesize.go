package main

import (
	"context"
	"errors"

	"github.com/alecthomas/kingpin/v2"
)

// synthesizeCommand is a placeholder until the command is written.
func synthesizeCommand(app *kingpin.Application) command {
	cl := app.Command("synthesize", "not written yet")
	return command{clause: cl, run: func(context.Context, streams) error {
		return errors.New("synthesize: not implemented")
	}}
}
