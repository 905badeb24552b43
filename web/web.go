// Package web holds the lab's page: the same runs as the curl walkthrough,
// one click each.
package web

import (
	_ "embed"
	"strconv"
	"strings"
)

//go:embed index.html
var index string

// Page returns the page for a lab served under basePath ("" or "/16").
func Page(basePath string) []byte {
	return []byte(strings.ReplaceAll(index, `"{{BASE}}"`, strconv.Quote(strings.TrimSuffix(basePath, "/"))))
}
