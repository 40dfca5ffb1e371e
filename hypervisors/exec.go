package hypervisors

// ExecResult is the outcome of a guest-agent command that ran to exit.
// Stdout and Stderr are bounded by the adapter (the tail is kept).
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Tail keeps the last n bytes of b (nil when empty): how adapters bound
// the output they return in an ExecResult.
func Tail(b []byte, n int) []byte {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	if len(b) == 0 {
		return nil
	}
	return b
}
