// Command gateway runs the PipeStream gateway, a standalone PipeStream peer,
// and small gRPC client verbs for people at a terminal. It only parses flags
// and wires packages together; the behaviour lives in gateway/, bridge/ and
// quicpeer/.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
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
		{"conformance", "serve or send one entity as the reference suite's Layer 0 matrix expects", runConformance},
	}
}

func main() { os.Exit(dispatch(os.Args[1:])) }

func dispatch(args []string) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && !slices.Contains([]string{"-h", "--help", "-help", "--version", "-version"}, args[0]) {
		return runServe(args)
	}
	switch args[0] {
	case "help", "-h", "--help", "-help":
		if len(args) > 1 {
			return dispatch([]string{args[1], "--help"})
		}
		usage(os.Stdout)
		return 0
	case "version", "--version", "-version":
		fmt.Println(version())
		return 0
	}
	for _, v := range verbs() {
		if v.name == args[0] {
			return v.run(args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "gateway: unknown command %q (see 'gateway help')\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "gateway: PipeStream gateway (gRPC + REST + WebSocket in front of PipeStream peers over QUIC)\n\nUsage:\n  gateway [serve] [flags]\n  gateway <command> [flags] [args]\n  gateway version\n\nCommands:\n")
	for _, v := range verbs() {
		fmt.Fprintf(w, "  %-12s %s\n", v.name, v.summary)
	}
	fmt.Fprintf(w, "\nRun 'gateway <command> --help' for a command's flags. Every flag can also be set\nwith the environment variable shown next to it (flags win).\n")
}

// version is the module version and VCS revision the binary was built
// from (runtime/debug build info).
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "gateway (no build info)"
	}
	v := "gateway " + bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision", "vcs.time":
			v += " " + s.Value
		case "vcs.modified":
			if s.Value == "true" {
				v += " (modified)"
			}
		}
	}
	return v + " " + bi.GoVersion
}
