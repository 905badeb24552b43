package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab/bench"
)

// runLoad is a workshop on one lab: simulated attendees, each joined with
// a token of its own, walking the README's path with think time, against a
// lab of its own (the same configuration as serve) or a running one
// (-url); then the report, and the checks, whose failure fails the command.
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	id := bench.NewID()
	m := NewMain(stderr)
	scratchSchema, scratchPrefix := "idempotency_lab_load_"+id, "idempotency-lab-load-"+id+":"
	m.Config.PGSchema, m.Config.RedisPrefix = scratchSchema, scratchPrefix
	m.Config.RedisPair = false // no step of the path fails Redis over
	fs, err := m.flags("lab load")
	if err != nil {
		return err
	}
	var cfg bench.WorkshopConfig
	remote := fs.String("url", "", "base URL of a running lab to load (default: start one here)")
	fs.IntVar(&cfg.Attendees, "attendees", 30, "simulated attendees, each joined with a token of its own")
	fs.IntVar(&cfg.Rounds, "rounds", 2, "times each attendee walks the path; 0: until -duration has passed")
	fs.DurationVar(&cfg.Duration, "duration", 0, "with -rounds 0, how long the attendees keep walking the path")
	fs.DurationVar(&cfg.Think, "think", 2*time.Second, "mean think time between two steps (each drawn between half and one and a half of it)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the think times and arrivals: the same seed repeats the same load")
	fs.IntVar(&cfg.Matrices, "matrices", 1, "attendees that also fetch the breakage matrix (timed alone first); 0: no matrix")
	jsonFile := fs.String("json", "", "write every figure as JSON to this file")
	markdown := fs.Bool("markdown", false, "print the table as markdown, after the command line that reproduces it")
	smoke := fs.Bool("smoke", false, "a very short load with every check: 3 attendees, 1 round, 50ms think time, no matrix")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if *smoke {
		for name, set := range map[string]func(){
			"attendees": func() { cfg.Attendees = 3 },
			"rounds":    func() { cfg.Rounds = 1 },
			"think":     func() { cfg.Think = 50 * time.Millisecond },
			"matrices":  func() { cfg.Matrices = 0 },
		} {
			if !given[name] {
				set()
			}
		}
	}
	switch {
	case cfg.Attendees < 1 || cfg.Attendees > 1000:
		return fmt.Errorf("-attendees must be in 1..1000 (got %d)", cfg.Attendees)
	case cfg.Rounds < 0:
		return fmt.Errorf("-rounds must not be negative (got %d)", cfg.Rounds)
	case cfg.Rounds == 0 && cfg.Duration <= 0:
		return errors.New("-rounds 0 needs a positive -duration")
	case cfg.Think < 0:
		return fmt.Errorf("-think must not be negative (got %s)", cfg.Think)
	case cfg.Matrices < 0 || cfg.Matrices > cfg.Attendees:
		return fmt.Errorf("-matrices must be in 0..%d, the attendees (got %d)", cfg.Attendees, cfg.Matrices)
	}
	// Attendees join as people do: the lab's join code, and room for them.
	cfg.JoinCode = m.Config.JoinCode
	if !given["max-attendees"] && os.Getenv("LAB_MAX_ATTENDEES") == "" {
		m.Config.MaxAttendees = max(m.Config.MaxAttendees, cfg.Attendees+1)
	}
	cfg.Command = reproduce("load", args, os.LookupEnv)
	cfg.Planned = func(p bench.WorkshopPlan) { fmt.Fprintf(stderr, "load: %s\n", p) }
	cfg.Progress = func(p bench.WorkshopProgress) {
		fmt.Fprintf(stderr, "load: %s, %d attendees active, %d requests, %d errors, %d shed, p99 %.0f ms\n",
			p.Elapsed.Round(time.Second), p.Active, p.Requests, p.Errors, p.Shed, p.P99MS)
	}
	level := m.LogLevel
	if level == "info" {
		level = "warn" // the progress is the output here
	}
	log, err := newLogger(stderr, level)
	if err != nil {
		return err
	}

	if *remote != "" {
		cfg.URL = strings.TrimSuffix(*remote, "/")
	} else {
		m.Config.Logger = log
		m.Config.FaultsEnabled = true
		// Started here, the throwaway PostgreSQL's connections can be counted.
		stopPG, embedded := ownPostgres(ctx, &m.Config, log)
		defer stopPG()
		defer dropScratch(ctx, m.Config, embedded, scratchSchema, scratchPrefix, log)
		a, stop, err := startOwnLab(ctx, m.Config)
		if err != nil {
			return err
		}
		defer stop()
		cfg.URL, cfg.InProcess = a.URL(), true
	}
	if m.Config.DatabaseURL != "" {
		pool, err := pgxpool.New(ctx, m.Config.DatabaseURL)
		if err != nil {
			return fmt.Errorf("error connecting to count PostgreSQL's connections: %w", err)
		}
		defer pool.Close()
		cfg.Connections = func(ctx context.Context) (open, active int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'active')
				FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&open, &active)
			return open, active, err
		}
	}
	res, err := bench.RunWorkshop(ctx, cfg)
	if err != nil {
		return err
	}
	if *jsonFile != "" {
		if err := writeJSONFile(*jsonFile, res); err != nil {
			return err
		}
	}
	if err := res.WriteTable(stdout, *markdown); err != nil {
		return err
	}
	if failed := res.Failures(); len(failed) > 0 {
		return fmt.Errorf("load failed: %d checks: %s", len(failed), strings.Join(failed[:min(len(failed), 5)], "; "))
	}
	return nil
}
