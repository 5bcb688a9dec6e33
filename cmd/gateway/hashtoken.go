package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pipestream/gateway/gateway"
)

const hashTokenHelp = `Print the --auth-tokens file line for a bearer token, so that the file holds
only SHA-256 hashes and never the tokens themselves. The token is read from
the first line of standard input (not from the command line, where it would
land in shell history and the process list). With --generate a new random
token (256 bits, base64url) is made, printed to standard error once, and its
line to standard output. The running gateway picks up file changes within a
few seconds (or at once on SIGHUP).

Example:
  printf '%s' "$TOKEN" | gateway hash-token acme >> tokens.txt
  gateway hash-token --generate acme >> tokens.txt`

func runHashToken(args []string) int {
	return hashToken(args, os.Stdin, os.Stdout, os.Stderr)
}

func hashToken(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlags("hash-token", "gateway hash-token [--generate] TENANT", hashTokenHelp)
	generate := fs.Bool("generate", "GATEWAY_HASH_TOKEN_GENERATE", false, "generate a new random token instead of reading one")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	tenant, ok := oneArg(fs, "TENANT")
	if !ok {
		return 2
	}
	// Validate the tenant exactly as the token file parser will.
	if _, err := gateway.ParseTokenFile([]byte(gateway.HashToken("x") + " " + tenant)); err != nil {
		return fail(stderr, "hash-token", errors.New(strings.TrimPrefix(err.Error(), "line 1: ")))
	}
	var token string
	if *generate {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fail(stderr, "hash-token", err)
		}
		token = base64.RawURLEncoding.EncodeToString(b[:])
		fmt.Fprintf(stderr, "token for tenant %s (shown once; give it to the client, it is not stored):\n%s\n", tenant, token)
	} else {
		line, err := bufio.NewReader(io.LimitReader(stdin, 64<<10)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fail(stderr, "hash-token", fmt.Errorf("read the token from stdin: %w", err))
		}
		token = strings.TrimRight(line, "\r\n")
		if token == "" {
			return fail(stderr, "hash-token", errors.New("no token on stdin: pipe it in (printf '%s' \"$TOKEN\" | gateway hash-token TENANT) or use --generate"))
		}
		if strings.TrimSpace(token) != token {
			return fail(stderr, "hash-token", errors.New("the token on stdin has leading or trailing spaces; clients send it trimmed, so it would never match"))
		}
	}
	fmt.Fprintf(stdout, "%s %s\n", gateway.HashToken(token), tenant)
	return 0
}
