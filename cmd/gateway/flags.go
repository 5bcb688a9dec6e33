package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// flagSet is a flag.FlagSet whose every flag also reads an environment
// variable: the variable sets the default, the command line overrides it,
// and --help prints the variable's name.
type flagSet struct {
	*flag.FlagSet
	envErrs []error
}

// newFlags builds the flag set of a verb; help is printed above the flags
// by --help (say what the verb does and give an example).
func newFlags(name, usageLine, help string) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError)}
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: %s\n\n%s\n\nFlags (environment variable in brackets):\n", usageLine, strings.TrimSpace(help))
		fs.PrintDefaults()
	}
	// Parse prints nothing itself: parse puts --help on stdout and a bad
	// flag in one line on stderr.
	fs.SetOutput(io.Discard)
	return fs
}

func (fs *flagSet) env(env, usage string) (string, bool, string) {
	v, ok := os.LookupEnv(env)
	return v, ok, fmt.Sprintf("%s [$%s]", usage, env)
}

func (fs *flagSet) String(name, env, def, usage string) *string {
	v, ok, u := fs.env(env, usage)
	if ok {
		def = v
	}
	return fs.FlagSet.String(name, def, u)
}

// Strings is a flag that may be given several times; its environment
// variable holds the values comma-separated. The command line, when it
// gives the flag at all, replaces the variable's values.
func (fs *flagSet) Strings(name, env, usage string) *[]string {
	v, ok, u := fs.env(env, usage+"; repeat the flag, or comma-separate in the variable")
	var vals []string
	if ok {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				vals = append(vals, s)
			}
		}
	}
	fromEnv := true
	fs.FlagSet.Func(name, u, func(s string) error {
		if fromEnv {
			vals, fromEnv = nil, false
		}
		vals = append(vals, s)
		return nil
	})
	return &vals
}

func (fs *flagSet) Bool(name, env string, def bool, usage string) *bool {
	v, ok, u := fs.env(env, usage)
	if ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			fs.envErrs = append(fs.envErrs, fmt.Errorf("$%s=%q: want true or false", env, v))
		}
		def = b
	}
	return fs.FlagSet.Bool(name, def, u)
}

func (fs *flagSet) Int64(name, env string, def int64, usage string) *int64 {
	v, ok, u := fs.env(env, usage)
	if ok {
		n, err := parseBytes(v)
		if err != nil {
			fs.envErrs = append(fs.envErrs, fmt.Errorf("$%s=%q: %v", env, v, err))
		}
		def = n
	}
	p := &def
	fs.FlagSet.Func(name, fmt.Sprintf("%s (default %s)", u, formatBytes(def)), func(s string) error {
		n, err := parseBytes(s)
		*p = n
		return err
	})
	return p
}

func (fs *flagSet) Uint(name, env string, def uint, usage string) *uint {
	v, ok, u := fs.env(env, usage)
	if ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			fs.envErrs = append(fs.envErrs, fmt.Errorf("$%s=%q: want a non-negative integer", env, v))
		}
		def = uint(n)
	}
	return fs.FlagSet.Uint(name, def, u)
}

func (fs *flagSet) Float64(name, env string, def float64, usage string) *float64 {
	v, ok, u := fs.env(env, usage)
	if ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			fs.envErrs = append(fs.envErrs, fmt.Errorf("$%s=%q: want a number", env, v))
		}
		def = f
	}
	return fs.FlagSet.Float64(name, def, u)
}

func (fs *flagSet) Duration(name, env string, def time.Duration, usage string) *time.Duration {
	v, ok, u := fs.env(env, usage)
	if ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			fs.envErrs = append(fs.envErrs, fmt.Errorf("$%s=%q: want a duration like 30s", env, v))
		}
		def = d
	}
	return fs.FlagSet.Duration(name, def, u)
}

// parse parses args; it returns (exit code, false) when the verb must stop
// (--help: 0, bad flags or environment: 2).
func (fs *flagSet) parse(args []string) (int, bool) {
	if err := fs.parseInterleaved(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fs.Usage()
			return 0, false
		}
		fmt.Fprintf(os.Stderr, "gateway %s: %v (see 'gateway %s --help')\n", fs.Name(), err, fs.Name())
		return 2, false
	}
	if len(fs.envErrs) > 0 {
		for _, err := range fs.envErrs {
			fmt.Fprintf(os.Stderr, "gateway %s: %v\n", fs.Name(), err)
		}
		return 2, false
	}
	return 0, true
}

// parseInterleaved parses flags anywhere among the arguments, as Go tools
// do (`gateway result ID -o out.txt`); everything after `--` is an
// argument. The arguments keep their order in fs.Args().
func (fs *flagSet) parseInterleaved(args []string) error {
	var pos []string
	for {
		if err := fs.FlagSet.Parse(args); err != nil {
			return err
		}
		rest := fs.FlagSet.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return fs.FlagSet.Parse(append([]string{"--"}, pos...))
}

// parseBytes reads a size: 1048576, 64KiB, 16MiB, 1GiB (also K, M, G, KB...).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(rest), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, errors.New("want a size like 1048576, 64KiB or 16MiB")
	}
	return n * mult, nil
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatInt(n, 10)
}

// fail prints "gateway <verb>: err" and returns exit code 1.
func fail(w io.Writer, verb string, err error) int {
	fmt.Fprintf(w, "gateway %s: %v\n", verb, err)
	return 1
}
