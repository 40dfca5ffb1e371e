package etcdstore

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReadOnly returns the document's key/value pairs under prefix as one
// consistent cut (every page at the revision of the first), without
// campaigning and without writing anything: what `provider plan` reads
// while the replicas run. It may miss a write the leader commits while it
// reads; it never shows a torn one.
func ReadOnly(ctx context.Context, client *clientv3.Client, prefix string, pageSize int) (map[string][]byte, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	if pageSize <= 0 {
		pageSize = DefaultLoadPageSize
	}
	state := prefix + stateDir
	var err error
	for range loadAttempts {
		var m map[string][]byte
		if m, err = readCut(ctx, client, state, int64(pageSize)); err == nil {
			return m, nil
		}
		if !errors.Is(err, rpctypes.ErrCompacted) {
			return nil, err
		}
	}
	return nil, err
}

func readCut(ctx context.Context, client *clientv3.Client, state string, page int64) (map[string][]byte, error) {
	end := clientv3.GetPrefixRangeEnd(state)
	var rev int64
	m := map[string][]byte{}
	from := state
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(page)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		g, err := client.Get(ctx, from, opts...)
		if err != nil {
			return nil, fmt.Errorf("read %s after %d keys: %w", state, len(m), err)
		}
		if rev == 0 {
			rev = g.Header.Revision
		}
		for _, kv := range g.Kvs {
			m[string(kv.Key[len(state):])] = kv.Value
		}
		if !g.More || len(g.Kvs) == 0 {
			return m, nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}
