package dispatcher

import (
	"fmt"
	"net/url"
)

// parseWorkersQuery reads GET /workers' parameters: detail (true/1 or false/0, default
// false), at most once. Unknown parameters are refused, so that a typo is not
// silently ignored.
func parseWorkersQuery(raw string) (detail bool, err error) {
	q, err := parseQueryString(raw)
	if err != nil {
		return false, err
	}
	for name, vs := range q {
		if name != "detail" {
			return false, fmt.Errorf("unknown parameter %q; /workers takes only detail", name)
		}
		if len(vs) > 1 {
			return false, fmt.Errorf("detail is given %d times", len(vs))
		}
	}
	switch q.Get("detail") {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	}
	return false, fmt.Errorf("detail must be true or false")
}

// parseQueryString parses a raw query string whole. Not echo's QueryParams, which drop
// the parse error and with it every pair after a bad escape or a semicolon: a
// parameter would be silently lost and the request carried out without it.
func parseQueryString(raw string) (url.Values, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return nil, fmt.Errorf("query string: %w", err)
	}
	return q, nil
}

// parseDrainQuery reads POST /workers/{id}/drain's only parameter, reason (optional).
func parseDrainQuery(raw string) (reason string, err error) {
	q, err := parseQueryString(raw)
	if err != nil {
		return "", err
	}
	for name, vs := range q {
		if name != "reason" {
			return "", fmt.Errorf("unknown parameter %q; drain takes only reason", name)
		}
		if len(vs) > 1 {
			return "", fmt.Errorf("reason is given %d times", len(vs))
		}
	}
	return q.Get("reason"), nil
}

// parseTaskID checks the id of GET /tasks/{id} with the rules of a submitted task_id,
// so that a malformed or oversized id gets 400 rather than a lookup.
func parseTaskID(id string) (string, error) {
	if id == "" {
		return "", badRequest("task id is required")
	}
	if err := checkName("task id", id, maxIDLength, true); err != nil {
		return "", err
	}
	return id, nil
}
