package main

import (
	"context"
	"errors"

	"github.com/alecthomas/kingpin/v2"
)

// hashCommand is a placeholder until the command is written.
func hashCommand(app *kingpin.Application) command {
	cl := app.Command("hash", "not written yet")
	return command{clause: cl, run: func(context.Context, streams) error {
		return errors.New("hash: not implemented")
	}}
}
