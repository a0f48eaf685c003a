-- The maintenance leader (docs/architecture.md, "One runner maintains the
-- schema"). The schema-wide scans of the runners' maintenance (deadlines,
-- wall-time budgets, unknown kinds, lapsed reservations, holder rows of
-- lives long over) run on one runner per schema: the runner whose holder
-- row (a life, in the holders table) this one row names, for as long as
-- that row is live. Its lease is its holder row's lease: no second renewal, and a
-- leader that dies, is frozen or loses the database loses the leadership
-- when its holder row expires, as it loses its conversations. A runner
-- takes the leadership only while the row names no live holder, with a
-- holder row of its own that is live (internal/store's ElectLeader): at
-- most one live holder leads.
--
-- One row, or none: a runner that finds none inserts it.
CREATE TABLE {schema}.maintenance_leader (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    holder_id  bigint,
    elected_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.maintenance_leader (holder_id) VALUES (NULL);
