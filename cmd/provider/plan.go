package main

import (
	"context"
	"fmt"
	"io"
)

func plan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "provider plan: not available in this build")
	return 1
}
