package bench

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scenario (h) in go-workflows (issue 42), in the internal/bench/goworkflows
// subprocess: P turn workflows, each making C tool calls at once and waiting
// for all of them, on go-workflows' Postgres backend in a schema of its own,
// wrapped in its monoprocess backend (the worker woken in process, as
// go-workflows' own benchmark runs it). The subprocess creates the schema
// and migrates it; the harness drops it afterwards.

// agentGoWorkflows returns the RunFunc of the subject whose tool calls are
// tools: "activities" or "subworkflows".
func agentGoWorkflows(tools string) RunFunc {
	return func(ctx context.Context, env *Env, size Size) (Measurement, error) {
		if env.GoWorkflows == nil {
			return Measurement{}, errors.New("go-workflows is not available")
		}
		schema := randomName("gowf_bench")
		defer func() {
			dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_, _ = env.Pool.Exec(dropCtx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		}()
		return env.GoWorkflows.run(ctx, env, size, ", tools as "+tools, "-schema", schema, "-tools", tools,
			"-parents", strconv.Itoa(size.P), "-children", strconv.Itoa(size.C))
	}
}
