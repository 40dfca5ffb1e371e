package inventory

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/hashicorp/go-multierror"
)

// listFormat renders a multierror as one problem per line, so that every
// line can be read (and tested) on its own.
func listFormat(errs []error) string {
	lines := make([]string, len(errs))
	for i, err := range errs {
		lines[i] = err.Error()
	}
	return strings.Join(lines, "\n")
}

// finish returns nil when errs holds no problem, else errs formatted one
// problem per line. multierror.Append flattens nested lists, so every
// entry of the result is a single problem.
func finish(errs *multierror.Error) error {
	if errs.ErrorOrNil() == nil {
		return nil
	}
	errs.ErrorFormat = listFormat
	return errs
}

// prefixed returns one problem per err, each led by what.
func prefixed(what string, errs []error) error {
	out := &multierror.Error{}
	for _, e := range errs {
		out = multierror.Append(out, fmt.Errorf("%s: %w", what, e))
	}
	return finish(out)
}

// jsonError rewords the decoder's errors so they name the offending key.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Type.Kind() == reflect.String && (te.Field == "resources" || te.Field == "labels") {
			return fmt.Sprintf("key %q must map names to JSON strings, got a %s value", te.Field, te.Value)
		}
		if te.Field == "" {
			return fmt.Sprintf("must be a JSON %s, got %s", jsonKind(te.Type), te.Value)
		}
		return fmt.Sprintf("key %q must be a JSON %s, got %s", te.Field, jsonKind(te.Type), te.Value)
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown key " + rest
	}
	return strings.TrimPrefix(msg, "json: ")
}

func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "integer"
	case reflect.String:
		return "string"
	case reflect.Map, reflect.Struct:
		if t.Kind() == reflect.Map && t.Elem().Kind() == reflect.String {
			return "object of strings"
		}
		return "object"
	case reflect.Slice:
		return "array"
	}
	return t.String()
}

// notJSON reports a syntax error; a bare io.EOF means the input ended
// early.
func notJSON(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("not valid JSON: unexpected end of input")
	}
	return fmt.Errorf("not valid JSON: %w", err)
}

// inFile leads every problem in err with path.
func inFile(path string, err error) error {
	var me *multierror.Error
	if errors.As(err, &me) {
		return prefixed(path, me.Errors)
	}
	return fmt.Errorf("%s: %w", path, err)
}
