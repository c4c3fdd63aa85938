package ticketing

// Written is how many request lines c has written (tests only).
func Written(c *Client) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}
