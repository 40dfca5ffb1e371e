package desired

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// Cursor layout: "bf", a version byte, the lineage, then the position and
// a 4-byte checksum. Version 1 carried only a revision (a delta cursor);
// version 2 carries the walk phase too. Both are read.
const (
	cursorV1 = 1
	cursorV2 = 2
)

// encodeCursor renders c as an opaque List cursor bound to this
// document's lineage.
func (d *Document) encodeCursor(c cursor) []byte {
	b := make([]byte, 0, 3+len(d.lineage)+1+24+4)
	b = append(b, 'b', 'f', cursorV2)
	b = append(b, d.lineage...)
	b = append(b, c.phase)
	b = binary.BigEndian.AppendUint64(b, c.pos)
	b = binary.BigEndian.AppendUint64(b, c.pivot)
	b = binary.BigEndian.AppendUint64(b, c.wrap)
	sum := sha256.Sum256(b)
	return append(b, sum[:4]...)
}

// decodeCursor reads a cursor; ok is false for anything this document did
// not produce or cannot continue (garbage, corruption, another lineage, a
// position from the future).
func (d *Document) decodeCursor(raw []byte, newest uint64) (cursor, bool) {
	lin := len(d.lineage)
	if len(raw) < 3+lin+4 || raw[0] != 'b' || raw[1] != 'f' {
		return cursor{}, false
	}
	body, sum := raw[:len(raw)-4], raw[len(raw)-4:]
	want := sha256.Sum256(body)
	if string(want[:4]) != string(sum) || string(body[3:3+lin]) != string(d.lineage) {
		return cursor{}, false
	}
	rest := body[3+lin:]
	var c cursor
	switch {
	case raw[2] == cursorV1 && len(rest) == 8:
		c = cursor{phase: phaseDelta, pos: binary.BigEndian.Uint64(rest)}
	case raw[2] == cursorV2 && len(rest) == 25:
		c = cursor{phase: rest[0], pos: binary.BigEndian.Uint64(rest[1:]),
			pivot: binary.BigEndian.Uint64(rest[9:]), wrap: binary.BigEndian.Uint64(rest[17:])}
	default:
		return cursor{}, false
	}
	switch c.phase {
	case phaseDelta:
		return c, c.pos <= newest
	case phaseUpper:
		return c, c.pivot >= 1 && c.pos+1 >= c.pivot && c.pos <= newest
	case phaseLower:
		return c, c.pos < c.pivot && c.pivot <= c.wrap+1 && c.wrap <= newest
	}
	return cursor{}, false
}

func lineageBytes(lineage string) []byte {
	b, err := hex.DecodeString(lineage)
	if err != nil {
		return []byte(lineage)
	}
	return b
}
