package etcdstore

import (
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/bigfleet-vm/provider/retry"
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
	return readRetrying(func() (map[string][]byte, error) {
		return readCut(ctx, client, state, int64(pageSize), nil)
	}, nil)
}

// readRetrying runs read again (at most retry.EtcdCompacted.Attempts
// times in all) while it fails because etcd compacted the revision it
// was reading; compacted, if set, hears of each such failure.
func readRetrying(read func() (map[string][]byte, error), compacted func(error)) (map[string][]byte, error) {
	m, err := retry.Value(context.Background(), retry.EtcdCompacted, func(err error) bool {
		if !errors.Is(err, rpctypes.ErrCompacted) {
			return false
		}
		if compacted != nil {
			compacted(err)
		}
		return true
	}, func(context.Context) (map[string][]byte, error) { return read() })
	if err != nil {
		return nil, err
	}
	return m, nil
}

// firstPage reads the first page of a cut; it returns the page and the
// revision every later page is read at.
type firstPage func(ctx context.Context, get clientv3.Op) (*pb.RangeResponse, int64, error)

// readCut reads every key under state, without the state prefix, as one
// consistent cut: the first page from first (a plain Get when nil), every
// later page at the revision of the first.
func readCut(ctx context.Context, client *clientv3.Client, state string, page int64, first firstPage) (map[string][]byte, error) {
	end := clientv3.GetPrefixRangeEnd(state)
	if first == nil {
		first = func(ctx context.Context, get clientv3.Op) (*pb.RangeResponse, int64, error) {
			g, err := client.Do(ctx, get)
			if err != nil {
				return nil, 0, err
			}
			return (*pb.RangeResponse)(g.Get()), g.Get().Header.Revision, nil
		}
	}
	rr, rev, err := first(ctx, clientv3.OpGet(state, clientv3.WithRange(end), clientv3.WithLimit(page)))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", state, err)
	}
	m := make(map[string][]byte, rr.Count)
	for {
		for _, kv := range rr.Kvs {
			m[string(kv.Key[len(state):])] = kv.Value
		}
		if !rr.More || len(rr.Kvs) == 0 {
			return m, nil
		}
		next := string(rr.Kvs[len(rr.Kvs)-1].Key) + "\x00"
		g, err := client.Get(ctx, next, clientv3.WithRange(end), clientv3.WithLimit(page), clientv3.WithRev(rev))
		if err != nil {
			return nil, fmt.Errorf("read %s at revision %d after %d keys: %w", state, rev, len(m), err)
		}
		rr = (*pb.RangeResponse)(g)
	}
}
