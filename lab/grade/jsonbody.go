package grade

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// decode reads a JSON document keeping numbers as written.
func decode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// pointer resolves a JSON pointer (RFC 6901) in doc.
func pointer(doc any, p string) (any, bool) {
	if p == "" {
		return doc, true
	}
	if !strings.HasPrefix(p, "/") {
		return nil, false
	}
	for _, tok := range strings.Split(p[1:], "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch v := doc.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, false
			}
			doc = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			doc = v[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// idText is an id as text: a string, or a number as written.
func idText(v any) string {
	switch id := v.(type) {
	case string:
		return id
	case json.Number:
		return id.String()
	}
	return ""
}

// idAt is the id at pointer p of a JSON body, "" when there is none.
func idAt(body []byte, p string) string {
	doc, err := decode(body)
	if err != nil {
		return ""
	}
	v, ok := pointer(doc, p)
	if !ok {
		return ""
	}
	return idText(v)
}

// idsAt reads a read-back's answer: the array at pointer list, whose
// elements are ids or resources holding one at idPointer.
func idsAt(body []byte, list, idPointer string) ([]string, error) {
	doc, err := decode(body)
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	v, ok := pointer(doc, list)
	if !ok {
		return nil, fmt.Errorf("nothing at %q", list)
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("no array at %q", list)
	}
	ids := []string{}
	for i, el := range arr {
		id := idText(el)
		if id == "" {
			if inner, ok := pointer(el, idPointer); ok {
				id = idText(inner)
			}
		}
		if id == "" {
			return nil, fmt.Errorf("element %d holds no id at %q", i, idPointer)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// canonical is a JSON body with object keys sorted and no spaces; a body
// that is no JSON stays as it is.
func canonical(body []byte) []byte {
	v, err := decode(body)
	if err != nil {
		return body
	}
	b, err := json.Marshal(v) // maps marshal with sorted keys; json.Number as written
	if err != nil {
		return body
	}
	return b
}

// field is one member of a JSON object, in the order it was written.
type field struct {
	name  string
	value json.RawMessage
}

// fields reads a JSON object's members in order.
func fields(body []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("the body is no JSON object")
	}
	var out []field
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		out = append(out, field{name: tok.(string), value: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return out, nil
}

func writeObject(fs []field, sep, indent string) []byte {
	var b bytes.Buffer
	b.WriteString("{" + indent)
	for i, f := range fs {
		if i > 0 {
			b.WriteString("," + indent)
		}
		name, _ := json.Marshal(f.name)
		b.Write(name)
		b.WriteString(sep)
		b.Write(f.value)
	}
	b.WriteString(strings.TrimRight(indent, " ") + "}")
	return b.Bytes()
}

// reordered is the same JSON object with its members in reverse order and
// other whitespace: the same request, written by another client.
func reordered(body []byte) ([]byte, error) {
	fs, err := fields(body)
	if err != nil {
		return nil, err
	}
	if len(fs) < 2 {
		return nil, errors.New("the body has fewer than two fields to reorder")
	}
	rev := make([]field, len(fs))
	for i, f := range fs {
		rev[len(fs)-1-i] = f
	}
	return writeObject(rev, " : ", "\n  "), nil
}

// bumped is another payload: body with its first integer member plus one.
func bumped(body []byte) ([]byte, error) {
	fs, err := fields(body)
	if err != nil {
		return nil, err
	}
	for i, f := range fs {
		n, err := strconv.ParseInt(string(f.value), 10, 64)
		if err != nil {
			continue
		}
		fs[i].value = json.RawMessage(strconv.FormatInt(n+1, 10))
		return writeObject(fs, ":", ""), nil
	}
	return nil, errors.New("the body has no integer field to change (give another payload with -other-body)")
}
