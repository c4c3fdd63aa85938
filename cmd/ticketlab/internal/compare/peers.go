package compare

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	goredislib "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// ---------------------------------------------------------------------------
// etcd: clientv3/concurrency Mutex. One *clientv3.Client is shared by every
// benchmark client (etcd's usual shape: one client per process, its gRPC
// connection balanced over the endpoints); each benchmark client has its
// own Session (its own lease, TTL 30 s, kept alive by the client), reused
// for every cycle of the run, and a new Mutex per cycle (Mutex is just the
// prefix; its key is prefix/lease).

type etcdSystem struct {
	endpoints []string
	cli       *clientv3.Client
	perClient bool   // a clientv3.Client (gRPC connection) per benchmark client
	peersDir  string // peers.sh's DIR: the members' pids
	ver       string
}

func newEtcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

func newEtcd(ctx context.Context, endpoints []string, perClient bool, peersDir string) (*etcdSystem, error) {
	cli, err := newEtcdClient(endpoints)
	if err != nil {
		return nil, err
	}
	s := &etcdSystem{endpoints: endpoints, cli: cli, perClient: perClient, peersDir: peersDir}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, ep := range endpoints {
		st, err := cli.Status(sctx, ep)
		if err != nil {
			cli.Close()
			return nil, fmt.Errorf("etcd %s: %w (peers.sh start?)", ep, err)
		}
		s.ver = st.Version
	}
	return s, nil
}

func (s *etcdSystem) Name() string { return "etcd" }
func (s *etcdSystem) Setup() string {
	shape := "one shared clientv3.Client"
	if s.perClient {
		shape = "one clientv3.Client per client"
	}
	return "3 etcd members on loopback (" + strings.Join(s.endpoints, ",") + "), plaintext, default durability (WAL fsync per commit batch); " +
		"clientv3/concurrency Mutex, " + shape + ", one Session (lease TTL 30 s) per client"
}
func (s *etcdSystem) Version() string                         { return s.ver }
func (s *etcdSystem) Prepare(context.Context, []string) error { return nil }
func (s *etcdSystem) Close()                                  { s.cli.Close() }

// Processes: the members peers.sh started (etcd-1..3, the Nth serving the
// Nth endpoint), the leader as the members' status says.
func (s *etcdSystem) Processes(ctx context.Context) ([]Process, error) {
	ps, err := peerProcesses(s.peersDir, []string{"etcd-1", "etcd-2", "etcd-3"}, "etcd")
	if err != nil || len(s.endpoints) != len(ps) {
		return ps, err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i, ep := range s.endpoints {
		if st, err := s.cli.Status(sctx, ep); err == nil && st.Header != nil {
			ps[i].Role = "follower"
			if st.Header.MemberId == st.Leader {
				ps[i].Role = "leader"
			}
		}
	}
	return ps, nil
}

func (s *etcdSystem) Clients(ctx context.Context, n int) ([]Client, func(), error) {
	out, err := openClients(n, 32, func() (Client, error) {
		cli, own := s.cli, (*clientv3.Client)(nil)
		if s.perClient {
			var err error
			if own, err = newEtcdClient(s.endpoints); err != nil {
				return nil, err
			}
			cli = own
		}
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(Lease/time.Second)), concurrency.WithContext(context.Background()))
		if err != nil {
			if own != nil {
				own.Close()
			}
			return nil, err
		}
		return &etcdClient{sess: sess, own: own}, nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("etcd session: %w", err)
	}
	return out, func() {}, nil
}

// openClients opens n clients, at most width at a time; on any failure it
// closes those opened and returns the first error.
func openClients(n, width int, open func() (Client, error)) ([]Client, error) {
	out := make([]Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = open()
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			closeAll(nonNil(out))
			return nil, err
		}
	}
	return out, nil
}

type etcdClient struct {
	sess *concurrency.Session
	own  *clientv3.Client // nil when shared
}

func (c *etcdClient) Acquire(ctx context.Context, key string) (Held, error) {
	m := concurrency.NewMutex(c.sess, "/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return etcdHeld{m}, nil
}

type etcdHeld struct{ m *concurrency.Mutex }

func (h etcdHeld) Release(ctx context.Context) error { return h.m.Unlock(ctx) }
func (c *etcdClient) Close() {
	c.sess.Close()
	if c.own != nil {
		c.own.Close()
	}
}

// ---------------------------------------------------------------------------
// ZooKeeper: go-zookeeper's lock recipe (zk.NewLock: an ephemeral
// sequential node under the lock's path, wait for the next lower one to
// go). Each benchmark client has its own zk.Conn, hence its own ZooKeeper
// session (session timeout 30 s), connected to one of the three servers
// chosen at random by the library; a lock node belongs to a session, like
// a Ticketing lock to its unix connection. The recipe's persistent parent
// nodes are created before the run (Prepare), so the measured cycle is the
// recipe's create/children/watch/delete, not one-time setup.

type zkSystem struct {
	servers  []string
	admin    *zk.Conn
	peersDir string // peers.sh's DIR: the servers' pids
	ver      string
}

type zkQuiet struct{}

func (zkQuiet) Printf(string, ...any) {}

func zkConnect(ctx context.Context, servers []string) (*zk.Conn, error) {
	conn, ev, err := zk.Connect(servers, Lease, zk.WithLogger(zkQuiet{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	for {
		select {
		case e := <-ev:
			if e.State == zk.StateHasSession {
				go func() { // drain session events
					for range ev {
					}
				}()
				return conn, nil
			}
		case <-t.C:
			conn.Close()
			return nil, fmt.Errorf("zookeeper %v: no session within 15 s (peers.sh start?)", servers)
		case <-ctx.Done():
			conn.Close()
			return nil, ctx.Err()
		}
	}
}

func newZK(ctx context.Context, servers []string, peersDir string) (*zkSystem, error) {
	admin, err := zkConnect(ctx, servers)
	if err != nil {
		return nil, err
	}
	s := &zkSystem{servers: servers, admin: admin, peersDir: peersDir}
	if out, err := fourLetter(servers[0], "srvr"); err == nil {
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, "Zookeeper version: "); ok {
				s.ver, _, _ = strings.Cut(v, ",")
				s.ver, _, _ = strings.Cut(s.ver, "-${") // Debian's build leaves a placeholder
				s.ver = strings.TrimSpace(s.ver)
			}
		}
	}
	return s, nil
}

// fourLetter sends a ZooKeeper four-letter command and returns the answer.
func fourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	var sb strings.Builder
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		sb.WriteString(sc.Text() + "\n")
	}
	return sb.String(), nil
}

func (s *zkSystem) Name() string { return "zookeeper" }
func (s *zkSystem) Setup() string {
	return "3 ZooKeeper servers on loopback (" + strings.Join(s.servers, ",") + "), plaintext, forceSync=yes (txn log fsync per commit batch); " +
		"go-zookeeper lock recipe, one zk.Conn (session, timeout 30 s) per client"
}
func (s *zkSystem) Version() string { return s.ver }
func (s *zkSystem) Close()          { s.admin.Close() }

// Processes: the JVMs peers.sh started (zk-1..3, the Nth serving the Nth
// server address), the leader as `srvr` says.
func (s *zkSystem) Processes(context.Context) ([]Process, error) {
	ps, err := peerProcesses(s.peersDir, []string{"zk-1", "zk-2", "zk-3"}, "java")
	if err != nil || len(s.servers) != len(ps) {
		return ps, err
	}
	for i, addr := range s.servers {
		out, err := fourLetter(addr, "srvr")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(out, "\n") {
			if m, ok := strings.CutPrefix(l, "Mode: "); ok {
				ps[i].Role = strings.TrimSpace(m)
			}
		}
	}
	return ps, nil
}

// Prepare creates the persistent parent nodes of every key's lock path,
// level by level: each level's new paths in multi requests of up to 500
// creates, 8 in flight; a batch that fails (a node exists already) is
// retried one create at a time.
func (s *zkSystem) Prepare(ctx context.Context, keys []string) error {
	levels := map[int]map[string]bool{}
	for _, k := range keys {
		parts := strings.Split(k, "/")
		for d := 1; d <= len(parts); d++ {
			p := "/" + strings.Join(parts[:d], "/")
			if levels[d] == nil {
				levels[d] = map[string]bool{}
			}
			levels[d][p] = true
		}
	}
	var depths []int
	for d := range levels {
		depths = append(depths, d)
	}
	sort.Ints(depths)
	for _, d := range depths {
		var paths []string
		for p := range levels[d] {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		batches := make(chan []string)
		errc := make(chan error, 1)
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for batch := range batches {
					if err := s.createAll(batch); err != nil {
						select {
						case errc <- err:
						default:
						}
					}
				}
			}()
		}
		for i := 0; i < len(paths); i += 500 {
			batches <- paths[i:min(i+500, len(paths))]
		}
		close(batches)
		wg.Wait()
		select {
		case err := <-errc:
			return err
		default:
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

func (s *zkSystem) createAll(paths []string) error {
	ops := make([]any, len(paths))
	for i, p := range paths {
		ops[i] = &zk.CreateRequest{Path: p, Acl: zkACL}
	}
	if len(paths) > 1 {
		if _, err := s.admin.Multi(ops...); err == nil {
			return nil
		}
	}
	for _, p := range paths {
		if _, err := s.admin.Create(p, nil, 0, zkACL); err != nil && err != zk.ErrNodeExists {
			return fmt.Errorf("zookeeper create %s: %w", p, err)
		}
	}
	return nil
}

func (s *zkSystem) Clients(ctx context.Context, n int) ([]Client, func(), error) {
	out, err := openClients(n, 16, func() (Client, error) {
		c, err := zkConnect(ctx, s.servers)
		if err != nil {
			return nil, err
		}
		return &zkClient{conn: c}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, func() {}, nil
}

type zkClient struct{ conn *zk.Conn }

var zkACL = zk.WorldACL(zk.PermAll)

func (c *zkClient) Acquire(ctx context.Context, key string) (Held, error) {
	// The recipe has no context: the run's end closes the connection,
	// which ends a waiting Lock with an error.
	stop := context.AfterFunc(ctx, c.conn.Close)
	defer stop()
	l := zk.NewLock(c.conn, "/"+key, zkACL)
	if err := l.Lock(); err != nil {
		return nil, err
	}
	return zkHeld{l}, nil
}

type zkHeld struct{ l *zk.Lock }

func (h zkHeld) Release(context.Context) error { return h.l.Unlock() }
func (c *zkClient) Close()                     { c.conn.Close() }

// ---------------------------------------------------------------------------
// Redis: redsync over go-redis, against ONE unreplicated Redis without
// persistence. redsync has no waiting: a contended Lock polls (SET NX,
// then a delete-if-mine script after a failed try) every RetryDelay
// (uniformly jittered over ±50 %), up to Tries times. For a waiting lock
// the tries are unlimited; the run's end cancels the context. Each run
// has one go-redis client (pool of clients+8 connections) and one
// Redsync shared by all benchmark clients; a new Mutex per cycle
// (expiry 30 s).

type redisSystem struct {
	addr       string
	retryDelay time.Duration
	peersDir   string // peers.sh's DIR: the server's pid
	ver        string
}

func newRedis(ctx context.Context, addr string, retryDelay time.Duration, peersDir string) (*redisSystem, error) {
	rdb := goredislib.NewClient(&goredislib.Options{Addr: addr})
	defer rdb.Close()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := rdb.Info(sctx, "server").Result()
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w (peers.sh start?)", addr, err)
	}
	s := &redisSystem{addr: addr, retryDelay: retryDelay, peersDir: peersDir}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			s.ver = v
		}
	}
	return s, nil
}

func (s *redisSystem) Name() string { return "redis" }
func (s *redisSystem) Setup() string {
	return fmt.Sprintf("ONE Redis on %s, unreplicated, no persistence (save \"\", appendonly no: nothing fsynced); "+
		"redsync + go-redis, expiry 30 s, unlimited tries, polls every %v ±50%%", s.addr, s.retryDelay)
}
func (s *redisSystem) Version() string                         { return s.ver }
func (s *redisSystem) Prepare(context.Context, []string) error { return nil }
func (s *redisSystem) Close()                                  {}

// Processes: the one server peers.sh started.
func (s *redisSystem) Processes(context.Context) ([]Process, error) {
	return peerProcesses(s.peersDir, []string{"redis"}, "redis-server")
}

func (s *redisSystem) Clients(ctx context.Context, n int) ([]Client, func(), error) {
	rdb := goredislib.NewClient(&goredislib.Options{Addr: s.addr, PoolSize: n + 8})
	rs := redsync.New(goredis.NewPool(rdb))
	d := s.retryDelay
	delay := func(int) time.Duration {
		return d/2 + time.Duration(rand.Int64N(int64(d)+1))
	}
	out := make([]Client, n)
	for i := range out {
		out[i] = &redisClient{rs: rs, delay: delay}
	}
	return out, func() { rdb.Close() }, nil
}

type redisClient struct {
	rs    *redsync.Redsync
	delay redsync.DelayFunc
}

func (c *redisClient) Acquire(ctx context.Context, key string) (Held, error) {
	m := c.rs.NewMutex(key, redsync.WithExpiry(Lease), redsync.WithTries(math.MaxInt32),
		redsync.WithRetryDelayFunc(c.delay))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return redisHeld{m}, nil
}

type redisHeld struct{ m *redsync.Mutex }

func (h redisHeld) Release(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("redsync: unlock: not held")
	}
	return nil
}
func (c *redisClient) Close() {}

func nonNil(cs []Client) []Client {
	var out []Client
	for _, c := range cs {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}
