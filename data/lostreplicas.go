package data

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// LostReplica is a registered replica whose lease ended, as stored so a
// restarted gateway lists it as lost again.
type LostReplica struct {
	ReplicaID string
	WorkerID  string
	Address   string
	Models    []string
	Reason    string
	Was       string // the state it was in when it was lost
	LostAt    time.Time
}

// SaveLostReplica records l, replacing what was stored for its replica id.
func (s *Store) SaveLostReplica(ctx context.Context, l LostReplica) error {
	models, err := json.Marshal(l.Models)
	if err != nil {
		return fmt.Errorf("save lost replica %s: %w", l.ReplicaID, err)
	}
	if l.Models == nil {
		models = []byte("[]")
	}
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO lost_replicas (replica_id, worker_id, address, models, reason, was, lost_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (replica_id) DO UPDATE SET worker_id = excluded.worker_id, address = excluded.address,
				models = excluded.models, reason = excluded.reason, was = excluded.was, lost_at = excluded.lost_at`,
			l.ReplicaID, l.WorkerID, l.Address, string(models), l.Reason, l.Was, toMicros(l.LostAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("save lost replica %s: %w", l.ReplicaID, err)
	}
	return nil
}

// DeleteLostReplica forgets the lost replica with id (its worker was heard
// again, or it was forgotten or revoked); none stored is not an error.
func (s *Store) DeleteLostReplica(ctx context.Context, id string) error {
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM lost_replicas WHERE replica_id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete lost replica %s: %w", id, err)
	}
	return nil
}

// LostReplicas returns the stored lost replicas, by replica id.
func (s *Store) LostReplicas(ctx context.Context) ([]LostReplica, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT replica_id, worker_id, address, models, reason, was, lost_at
		FROM lost_replicas ORDER BY replica_id`)
	if err != nil {
		return nil, fmt.Errorf("lost replicas: %w", err)
	}
	defer rows.Close()
	var out []LostReplica
	for rows.Next() {
		var l LostReplica
		var models string
		var at int64
		if err := rows.Scan(&l.ReplicaID, &l.WorkerID, &l.Address, &models, &l.Reason, &l.Was, &at); err != nil {
			return nil, fmt.Errorf("lost replicas: %w", err)
		}
		if err := json.Unmarshal([]byte(models), &l.Models); err != nil {
			return nil, fmt.Errorf("lost replicas: %s models: %w", l.ReplicaID, err)
		}
		l.LostAt = fromMicros(at)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lost replicas: %w", err)
	}
	return out, nil
}
