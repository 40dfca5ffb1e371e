package desired

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Keys the store keeps beside its records (Pinned) and the one a store
// that had to drop acknowledged records writes its report under (LossKey).
const (
	// keyEpochs holds the fence epochs (see epochs).
	keyEpochs = "meta/fence"
	// LossKey is where a store that dropped acknowledged records in an
	// explicit recovery (statefile Options.Recover) stores its report.
	// Open finds it, raises the fence floors, starts a new List lineage
	// and deletes it.
	LossKey = "meta/loss"
	// maxTrackedShards bounds the shards whose epochs are tracked one by
	// one; the epochs of further shards share one bucket.
	maxTrackedShards = 32
)

// Pinned reports whether key holds one of the document's counters, which
// must never regress: the document header (next operation id) and the
// fence epochs. A store that can lose the tail of what it acknowledged
// (the local journal) keeps their newest values apart from its records
// (statefile Options.Pinned), so that a recovery restores them.
func Pinned(key string) bool { return key == keyMeta || key == keyEpochs }

// epochs bounds what an explicit recovery that lost acknowledged records
// can let a zombie do. It keeps the highest fence epoch ever accepted per
// shard (by a hash of the shard id, for the first maxTrackedShards shards;
// one shared bucket for the rest), committed with the change that raised
// it and pinned beside the store's records. After such a loss the fence
// marks of the lost records are unknown, so every shard's epochs up to the
// highest it ever presented are refused from then on (Floor): no token
// accepted before the loss can be accepted again, and a shard continues
// by presenting a new epoch, as after losing its lease.
type epochs struct {
	Seen       map[string]int64 `json:"seen,omitempty"`
	Other      *int64           `json:"other,omitempty"`
	Floor      map[string]int64 `json:"floor,omitempty"`
	FloorOther *int64           `json:"floor_other,omitempty"`
}

// shardHash names a shard in epochs: bounded in size whatever the id.
func shardHash(shard string) string {
	h := sha256.Sum256([]byte(shard))
	return hex.EncodeToString(h[:8])
}

// observe records that shard presented an accepted token of epoch and
// reports whether anything changed.
func (e *epochs) observe(shard string, epoch int64) bool {
	k := shardHash(shard)
	if old, ok := e.Seen[k]; ok {
		if epoch <= old {
			return false
		}
		e.Seen[k] = epoch
		return true
	}
	if len(e.Seen) < maxTrackedShards {
		if e.Seen == nil {
			e.Seen = map[string]int64{}
		}
		e.Seen[k] = epoch
		return true
	}
	if e.Other != nil && epoch <= *e.Other {
		return false
	}
	e.Other = &epoch
	return true
}

// floor returns the epoch a token of shard must exceed, if a loss set one.
func (e *epochs) floor(shard string) (int64, bool) {
	if f, ok := e.Floor[shardHash(shard)]; ok {
		return f, true
	}
	if e.FloorOther != nil {
		return *e.FloorOther, true
	}
	return 0, false
}

// lost raises the floors to every epoch ever accepted: the fence marks of
// the records a recovery dropped are unknown.
func (e *epochs) lost() {
	for k, v := range e.Seen {
		if f, ok := e.Floor[k]; !ok || v > f {
			if e.Floor == nil {
				e.Floor = map[string]int64{}
			}
			e.Floor[k] = v
		}
	}
	if e.Other != nil && (e.FloorOther == nil || *e.Other > *e.FloorOther) {
		v := *e.Other
		e.FloorOther = &v
	}
}

func (e *epochs) encode() []byte {
	raw, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("encode fence epochs: %v", err)) // plain data: cannot fail
	}
	return raw
}
