package pgstore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/pipestream/gateway/bridge/store"
)

// Retention across replicas (docs/scale-out.md). Every replica's event log
// prunes the one shared events table, but each knows only its own clients'
// positions. So each publishes, at every retention pass and every share
// interval, the lowest position of its counting clients in one row of
// retention_positions (replica id, min_seq, clients, expires on the
// database's clock), and prunes by the minimum over its own clients and
// every other replica's unexpired row. A replica that dies stops
// refreshing its row: its clients stop holding the log back once the row
// expired. Close deletes the row.

// sharePositionsSQL upserts this replica's row ($1..$4), deletes expired
// rows of others, and answers the lowest min_seq and the sum of clients
// over the other replicas' unexpired rows with clients. The final SELECT
// reads the snapshot before the CTEs' changes, which touch only this
// replica's row and expired ones.
const sharePositionsSQL = `WITH up AS (
	INSERT INTO retention_positions (replica, min_seq, clients, expires)
	VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4))
	ON CONFLICT (replica) DO UPDATE SET min_seq = excluded.min_seq, clients = excluded.clients, expires = excluded.expires),
gone AS (DELETE FROM retention_positions WHERE replica <> $1 AND expires < clock_timestamp())
SELECT coalesce(min(min_seq), 0)::bigint, coalesce(sum(clients), 0)::bigint FROM retention_positions
	WHERE replica <> $1 AND clients > 0 AND expires > clock_timestamp()`

// SharePositions publishes mine (this replica's counting clients, valid
// for ttl) and returns the other replicas' combined positions: the lowest
// Min over their live rows that have clients, and the sum of their
// Clients (0: none holds anything back). One statement, one round trip.
func (s *Store) SharePositions(ctx context.Context, mine store.RetentionPositions, ttl time.Duration) (store.RetentionPositions, error) {
	if err := s.enter(); err != nil {
		return store.RetentionPositions{}, err
	}
	defer s.wg.Done()
	if ttl <= 0 || mine.Clients < 0 {
		return store.RetentionPositions{}, fmt.Errorf("%w: SharePositions needs ttl > 0 and Clients >= 0", store.ErrInvalid)
	}
	lowest := int64(0)
	if mine.Clients > 0 {
		lowest = int64(min(mine.Min, store.MaxSeq))
	}
	var oMin, oClients int64
	err := s.pool.QueryRow(ctx, sharePositionsSQL, s.lease.me, lowest, int32(min(mine.Clients, math.MaxInt32)), ttl.Seconds()).Scan(&oMin, &oClients)
	if err != nil {
		return store.RetentionPositions{}, mapErr("share retention positions", err)
	}
	return store.RetentionPositions{Min: uint64(oMin), Clients: int(oClients)}, nil
}

// withdrawPositions deletes this replica's row at Close: its clients stop
// holding the log back at once (they reconnect to another replica, which
// tracks them from then on).
func (s *Store) withdrawPositions() {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, "DELETE FROM retention_positions WHERE replica = $1", s.lease.me); err != nil {
		s.log.Warn("pgstore: withdrawing retention positions at close failed; they expire", "err", err)
	}
}
