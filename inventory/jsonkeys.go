package inventory

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// maxDuplicateReports bounds the duplicate keys one file reports.
const maxDuplicateReports = 20

// duplicateKeys reports every key that appears twice in one JSON object
// of data, at any depth, with the lines of both, one problem each.
// encoding/json would silently keep the last value, so a file that says
// "count" twice would mean something its reader did not see. Data that
// is not JSON yields no problem here (the decoder reports it).
func duplicateKeys(data []byte) []error {
	type frame struct {
		object  bool
		wantKey bool
		keys    map[string]int // key -> line
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var stack []*frame
	line, seen := 1, 0 // line number at offset seen
	lineAt := func(off int) int {
		if off > len(data) {
			off = len(data)
		}
		if off > seen {
			line += bytes.Count(data[seen:off], []byte{'\n'})
			seen = off
		}
		return line
	}
	var errs []error
	more := 0
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			break // io.EOF, or a syntax error the caller's decoder reports
		}
		top := (*frame)(nil)
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if top != nil && top.object {
					top.wantKey = false
				}
				stack = append(stack, &frame{object: t == '{', wantKey: t == '{', keys: map[string]int{}})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if top != nil && top.object && top.wantKey {
				// The key has just been read: the offset is past it.
				at := lineAt(int(dec.InputOffset()))
				if first, dup := top.keys[t]; dup {
					if len(errs) < maxDuplicateReports {
						errs = append(errs, fmt.Errorf("line %d: key %q is given twice in one object (first on line %d); keep one", at, t, first))
					} else {
						more++
					}
				} else {
					top.keys[t] = at
				}
				top.wantKey = false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
	if more > 0 {
		errs = append(errs, fmt.Errorf("%d more duplicate keys", more))
	}
	return errs
}
