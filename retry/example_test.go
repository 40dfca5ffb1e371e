package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bigfleet-vm/provider/retry"
)

var errBusy = errors.New("busy")

// A step is retried while its error is of a retryable class.
func ExampleDo() {
	attempts := 0
	err := retry.Do(context.Background(), retry.Policy{Initial: time.Millisecond, Max: time.Millisecond},
		func(err error) bool { return errors.Is(err, errBusy) },
		func(context.Context) error {
			if attempts++; attempts < 3 {
				return errBusy
			}
			return nil
		})
	fmt.Println(attempts, err)
	// Output: 3 <nil>
}

// A reconnect loop keeps one Backoff for the connection's life: each
// failed dial waits the next (jittered, capped) interval, and a dial that
// succeeds resets the schedule for the next outage.
func ExamplePolicy_Backoff() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dial := func(n int) error {
		if n%3 != 2 {
			return errors.New("connection refused")
		}
		return nil
	}
	b := retry.Policy{Initial: time.Millisecond, Max: 2 * time.Millisecond}.Backoff() // retry.Reconnect in production
	for n := range 6 {
		if err := dial(n); err != nil {
			if retry.Sleep(ctx, b.Next()) != nil {
				return
			}
			continue
		}
		b.Reset()
		fmt.Println("connected at attempt", n)
	}
	// Output:
	// connected at attempt 2
	// connected at attempt 5
}
