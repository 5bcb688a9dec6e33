// Command gofatal runs the gofatal analyzer (package internal/lint/gofatal)
// over packages and their tests: go run ./internal/lint/gofatal/cmd/gofatal ./...
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/pipestream/gateway/internal/lint/gofatal"
)

func main() { singlechecker.Main(gofatal.Analyzer) }
