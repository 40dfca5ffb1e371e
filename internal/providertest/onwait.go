package providertest

import (
	"context"
	"sync"
)

// OnWait returns a context like parent that runs f once, the moment code
// asks for its Done channel: that is, the moment it decided to wait. A
// test can so release what the code waits for exactly when it waits, and
// code that does not wait never runs f.
func OnWait(parent context.Context, f func()) context.Context {
	return &onWait{Context: parent, f: f}
}

type onWait struct {
	context.Context
	once sync.Once
	f    func()
}

func (c *onWait) Done() <-chan struct{} {
	c.once.Do(c.f)
	return c.Context.Done()
}
