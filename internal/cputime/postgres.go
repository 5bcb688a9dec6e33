// Package cputime reads CPU time for benchmarks: this process's, and a
// PostgreSQL server's on this machine (its postmaster and all its
// processes, from /proc), so that a benchmark can count the database's CPU
// per operation next to its own.
package cputime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// clkTck is USER_HZ, the unit of utime/stime in /proc/<pid>/stat (100 on
// every Linux architecture Go supports).
const clkTck = 100

// Postgres is a PostgreSQL server running on this machine.
type Postgres struct {
	// Postmaster is the server's main process.
	Postmaster int
	// Settings are fsync and synchronous_commit as the server reports them.
	Settings string
}

// FindPostgres connects to url, asks for the backend's pid and takes its parent
// as the postmaster. It refuses a server whose processes it cannot see in
// /proc (another machine or another pid namespace): its CPU could not be
// counted.
func FindPostgres(ctx context.Context, url string) (*Postgres, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	var (
		backend           int
		fsync, syncCommit string
	)
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid(), current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&backend, &fsync, &syncCommit); err != nil {
		return nil, fmt.Errorf("ask PostgreSQL for its backend pid: %w", err)
	}
	notLocal := fmt.Errorf("PostgreSQL backend pid %d is not a postgres process on this machine; its CPU is counted from /proc, so run PostgreSQL here (same pid namespace)", backend)
	st, err := readStat(backend)
	if err != nil || !strings.HasPrefix(st.comm, "postgres") {
		return nil, notLocal
	}
	pm, err := readStat(st.ppid)
	if err != nil || !strings.HasPrefix(pm.comm, "postgres") {
		return nil, notLocal
	}
	return &Postgres{Postmaster: st.ppid, Settings: fmt.Sprintf("server fsync=%s synchronous_commit=%s", fsync, syncCommit)}, nil
}

// Of is the CPU time (user + system) process pid has used so far, from
// /proc/<pid>/stat.
func Of(pid int) (time.Duration, error) {
	s, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return time.Duration(s.utime+s.stime) * time.Second / clkTck, nil
}

// CPU is the CPU time of the postmaster, its live children and its reaped
// children so far (a child that exits moves from the first sum to the
// second when the postmaster reaps it).
func (p *Postgres) CPU() (time.Duration, error) {
	pm, err := readStat(p.Postmaster)
	if err != nil {
		return 0, fmt.Errorf("PostgreSQL postmaster %d: %w", p.Postmaster, err)
	}
	ticks := pm.utime + pm.stime + pm.cutime + pm.cstime
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		s, err := readStat(pid)
		if err != nil || s.ppid != p.Postmaster {
			continue // gone meanwhile, or not a child
		}
		ticks += s.utime + s.stime
	}
	return time.Duration(ticks) * time.Second / clkTck, nil
}

// procStat holds the fields of /proc/<pid>/stat the bench uses.
type procStat struct {
	comm                         string
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// parseStat parses /proc/<pid>/stat: "pid (comm) state ppid ... utime
// stime cutime cstime ..." (fields 14 to 17); comm may hold spaces and
// parentheses, so the fields after it are found from the last ')'.
func parseStat(b []byte) (procStat, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, errors.New("malformed /proc stat line")
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 15 {
		return procStat{}, errors.New("short /proc stat line")
	}
	s := procStat{comm: string(b[open+1 : end])}
	var err error
	num := func(i int) int64 {
		v, e := strconv.ParseInt(f[i], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("/proc stat field %d: %w", i+3, e)
		}
		return v
	}
	// f[0] is field 3 (state): field n is f[n-3].
	s.ppid = int(num(1))
	s.utime, s.stime, s.cutime, s.cstime = num(11), num(12), num(13), num(14)
	return s, err
}
