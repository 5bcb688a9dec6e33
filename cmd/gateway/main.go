// Command gateway runs the PipeStream gateway, a standalone PipeStream peer,
// and small gRPC client verbs for people at a terminal. It only parses flags
// and wires packages together; the behaviour lives in gateway/, bridge/ and
// quicpeer/.
package main

import (
	"fmt"
	"os"
	"strings"
)

// verb is one subcommand.
type verb struct {
	name, summary string
	run           func(args []string) int
}

func verbs() []verb {
	return []verb{
		{"serve", "run the gateway (default when no verb is given)", runServe},
		{"peer", "run a standalone PipeStream processing peer (QUIC)", runPeer},
		{"submit", "upload a file as a document and print its id", runSubmit},
		{"get", "print a document as JSON", runGet},
		{"watch", "print every update of a document until it is terminal", runWatch},
		{"result", "write a finished document's result bytes", runResult},
		{"redeem", "redeem a claim check", runRedeem},
		{"hash-token", "print the --auth-tokens line for a bearer token (read from stdin)", runHashToken},
		{"bench", "measure the gateway against bare quic-go/grpc-go baselines", runBench},
	}
}

func main() { os.Exit(dispatch(os.Args[1:])) }

func dispatch(args []string) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" && args[0] != "-help" {
		return runServe(args)
	}
	switch args[0] {
	case "help", "-h", "--help", "-help":
		if len(args) > 1 {
			return dispatch([]string{args[1], "--help"})
		}
		usage()
		return 0
	}
	for _, v := range verbs() {
		if v.name == args[0] {
			return v.run(args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "gateway: unknown command %q\n\n", args[0])
	usage()
	return 2
}

func usage() {
	fmt.Fprintf(os.Stderr, "gateway: PipeStream gateway (gRPC + REST + WebSocket in front of PipeStream peers over QUIC)\n\nUsage:\n  gateway [serve] [flags]\n  gateway <command> [flags] [args]\n\nCommands:\n")
	for _, v := range verbs() {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", v.name, v.summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'gateway <command> --help' for a command's flags. Every flag can also be set\nwith the environment variable shown next to it (flags win).\n")
}
