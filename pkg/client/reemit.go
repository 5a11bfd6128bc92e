package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// MaxReemitKeys is the most keys one re-emission request takes; [Client.Reemit]
// sends more in several.
const MaxReemitKeys = 5000

// Reemitted is the answer to a re-emission: the documents whose current
// version's event was written to the outbox again, the keys never
// written, and (for [Client.ReemitAll]) the key the next page starts
// after, "" when none is left.
type Reemitted struct {
	Reemitted []ReemittedDocument `json:"reemitted"`
	NotFound  []string            `json:"not_found"`
	Next      string              `json:"next"`
}

// ReemittedDocument is one document re-emitted: its event keeps its id,
// with a new emission number.
type ReemittedDocument struct {
	Key      string `json:"key"`
	Version  int64  `json:"version"`
	EventID  string `json:"event_id"`
	Emission int64  `json:"emission"`
}

type reemitRequest struct {
	Keys  []string `json:"keys,omitempty"`
	All   bool     `json:"all,omitempty"`
	After string   `json:"after,omitempty"`
	Limit int      `json:"limit,omitempty"`
}

// Reemit writes the events of keys' current versions to the outbox again
// (it needs a token with the admin scope), in requests of at most
// [MaxReemitKeys]. On an error, the answer holds what the requests before
// it re-emitted.
func (c *Client) Reemit(ctx context.Context, keys []string) (Reemitted, error) {
	all := Reemitted{Reemitted: []ReemittedDocument{}, NotFound: []string{}}
	for lo := 0; lo < len(keys); lo += MaxReemitKeys {
		res, err := c.reemit(ctx, reemitRequest{Keys: keys[lo:min(lo+MaxReemitKeys, len(keys))]})
		if err != nil {
			return all, err
		}
		all.Reemitted = append(all.Reemitted, res.Reemitted...)
		all.NotFound = append(all.NotFound, res.NotFound...)
	}
	return all, nil
}

// ReemitAll re-emits every document whose key sorts after after, limit a
// request (0: the writer's default, 500), calling page with each answer.
// On an error, or when ctx ends, it returns the key to resume after.
func (c *Client) ReemitAll(ctx context.Context, after string, limit int, page func(Reemitted)) (resume string, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return after, fmt.Errorf("client: re-emission interrupted: %w", err)
		}
		res, err := c.reemit(ctx, reemitRequest{All: true, After: after, Limit: limit})
		if err != nil {
			return after, err
		}
		if page != nil {
			page(res)
		}
		if res.Next == "" {
			return "", nil
		}
		after = res.Next
	}
}

func (c *Client) reemit(ctx context.Context, req reemitRequest) (Reemitted, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Reemitted{}, err
	}
	var out Reemitted
	err = c.do(ctx, http.MethodPost, "/v1/admin/reemit", "application/json", body, &out)
	return out, err
}
