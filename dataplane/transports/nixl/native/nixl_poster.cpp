// A posting and completion thread for NIXL transfers, outside Python's GIL.
//
// NIXL's UCX backend copies a host-to-host write inside postXferReq. Posted from a Python thread, each
// copy then has to take the GIL back and the role worker polls every transfer for completion; here one
// native thread posts the queued requests in order, polls the running ones (NIXL's getXferStatus), and
// reports each finished transfer through an eventfd the worker waits on beside its sockets.
//
// NIXL's wheels ship no C++ headers for the agent, and its C API wraps agents of its own: the two
// agent methods used here are called through the addresses Python resolved in libnixl.so, with the
// agent pointer the NIXL bindings hold (__init__.py beside this file checks both before use). A
// member function of the Itanium C++ ABI is a function whose first argument is `this`.
//
// Build: g++ -O2 -std=c++17 -shared -fPIC -pthread (__init__.py builds it on first use).

#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using post_fn = int (*)(const void* agent, void* request, const void* extra);
using status_fn = int (*)(const void* agent, void* request);

static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "Queue::reported is read from Python as a plain 64-bit integer");

constexpr int kInProgress = 1;
constexpr int kSuccess = 0;

struct Transfer {
    uint64_t token;
    std::vector<void*> handles;
    std::vector<char> done;
    size_t posted = 0;
    int status = kInProgress;
    std::atomic<bool> cancelled{false};  // read by the thread only while it holds Queue::op
};

struct Queue {
    const void* agent;
    post_fn post;
    status_fn status;
    int efd;
    long max_pause_us;

    std::mutex m;  // guards everything below up to `op`
    std::condition_variable cv;
    std::condition_variable exited_cv;
    std::deque<std::shared_ptr<Transfer>> pending;
    std::unordered_map<uint64_t, std::shared_ptr<Transfer>> live;
    std::vector<std::pair<uint64_t, int>> finished;
    bool stop = false;
    bool exited = false;
    std::atomic<uint64_t> reported{0};  // finished transfers appended so far: Python reads it unlocked

    std::timed_mutex op;  // held by the thread while it calls NIXL for one transfer
    std::thread thread;
};

// Called with Queue::m held: no finished transfer waits, so the descriptor must not stay readable.
void clear(Queue* q) {
    uint64_t count;
    ssize_t rc = read(q->efd, &count, sizeof count);  // non-blocking: EAGAIN when already clear
    (void)rc;
}

void signal(Queue* q) {
    uint64_t one = 1;
    ssize_t rc = write(q->efd, &one, sizeof one);
    (void)rc;  // a full counter (2^64 - 2 unread signals) still leaves the descriptor readable
}

// Post what is unposted, in order; then read the state of what runs. True when it changed anything.
bool step(Queue* q, Transfer* t) {
    std::lock_guard<std::timed_mutex> guard(q->op);
    if (t->cancelled || t->status != kInProgress) return false;
    bool moved = false;
    // `cancelled` is re-read before every NIXL call: a cancel that timed out while this thread was
    // stuck in one call must stop it touching the transfer's other handles afterwards.
    while (t->posted < t->handles.size()) {
        if (t->cancelled) return true;
        int s = q->post(q->agent, t->handles[t->posted], nullptr);
        if (s < 0) {
            t->status = s;
            return true;
        }
        if (s == kSuccess) t->done[t->posted] = 1;
        t->posted++;
        moved = true;
    }
    bool all = true;
    for (size_t i = 0; i < t->handles.size(); i++) {
        if (t->done[i]) continue;
        if (t->cancelled) return true;
        int s = q->status(q->agent, t->handles[i]);
        if (s < 0) {
            t->status = s;
            return true;
        }
        if (s == kSuccess) {
            t->done[i] = 1;
            moved = true;
        } else {
            all = false;
        }
    }
    if (all) t->status = kSuccess;
    return moved || all;
}

void run(Queue* q) {
    prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);  // timed waits of a few microseconds end on time
    std::vector<std::shared_ptr<Transfer>> running;
    long pause_us = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(q->m);
            auto ready = [q] { return q->stop || !q->pending.empty(); };
            if (running.empty()) {
                q->cv.wait(lk, ready);
            } else if (pause_us > 0) {
                q->cv.wait_for(lk, std::chrono::microseconds(pause_us), ready);
            }
            if (q->stop) break;
            while (!q->pending.empty()) {
                running.push_back(std::move(q->pending.front()));
                q->pending.pop_front();
            }
        }
        bool moved = false;
        for (auto& t : running) moved |= step(q, t.get());
        std::vector<std::pair<uint64_t, int>> ended;
        std::lock_guard<std::timed_mutex> guard(q->op);
        auto gone = [&ended](const std::shared_ptr<Transfer>& t) {
            if (t->cancelled) return true;
            if (t->status == kInProgress) return false;
            ended.emplace_back(t->token, t->status);
            return true;
        };
        running.erase(std::remove_if(running.begin(), running.end(), gone), running.end());
        if (!ended.empty()) {
            std::lock_guard<std::mutex> lk(q->m);
            bool was_empty = q->finished.empty();
            for (auto& e : ended) {
                if (q->live.erase(e.first)) q->finished.push_back(e);
            }
            q->reported.fetch_add(ended.size(), std::memory_order_release);
            if (was_empty && !q->finished.empty()) signal(q);
        }
        // Spin while anything moves; back off (doubling, up to max_pause_us) while transfers wait on
        // the peer, woken early by a new submission.
        pause_us = moved ? 0 : std::min(std::max(2 * pause_us, 5L), q->max_pause_us);
    }
    std::lock_guard<std::mutex> lk(q->m);
    q->exited = true;
    q->exited_cv.notify_all();
}

}  // namespace

extern "C" {

// The agent pointer, postXferReq and getXferStatus addresses; the eventfd is the caller's.
void* pdpair_poster_open(const void* agent, void* post, void* status, int efd, long max_pause_us) {
    auto* q = new Queue();
    q->agent = agent;
    q->post = reinterpret_cast<post_fn>(post);
    q->status = reinterpret_cast<status_fn>(status);
    q->efd = efd;
    q->max_pause_us = max_pause_us > 0 ? max_pause_us : 200;
    q->thread = std::thread(run, q);
    return q;
}

// Queue one transfer: its handles are posted in order, and it finishes when all are done or one fails.
void pdpair_poster_submit(void* queue, uint64_t token, void* const* handles, int n) {
    auto* q = static_cast<Queue*>(queue);
    auto t = std::make_shared<Transfer>();
    t->token = token;
    t->handles.assign(handles, handles + n);
    t->done.assign(n, 0);
    {
        std::lock_guard<std::mutex> lk(q->m);
        q->pending.push_back(t);
        q->live.emplace(token, t);
    }
    q->cv.notify_one();
}

// Finished transfers since the last call (token, 0 = done or a negative NIXL status), at most `max`;
// clears the eventfd once none are left.
int pdpair_poster_take(void* queue, uint64_t* tokens, int32_t* statuses, int max) {
    auto* q = static_cast<Queue*>(queue);
    std::lock_guard<std::mutex> lk(q->m);
    int n = std::min<int>(max, static_cast<int>(q->finished.size()));
    for (int i = 0; i < n; i++) {
        tokens[i] = q->finished[i].first;
        statuses[i] = q->finished[i].second;
    }
    q->finished.erase(q->finished.begin(), q->finished.begin() + n);
    if (q->finished.empty()) clear(q);
    return n;
}

// The address of the count of finished transfers reported so far: while it has not moved since the
// last `take`, there is nothing to take (a load, where a call would cost the GIL-holding caller more).
const uint64_t* pdpair_poster_reported(void* queue) {
    return reinterpret_cast<const uint64_t*>(&static_cast<Queue*>(queue)->reported);
}

// Stop touching a transfer. 1: the thread will never touch its handles again (the caller releases
// them); 0: it had already finished (reported or about to be); -1: the thread is inside NIXL with
// it still after `wait_ms` (the handles must not be released: the caller leaks them).
int pdpair_poster_cancel(void* queue, uint64_t token, int wait_ms) {
    auto* q = static_cast<Queue*>(queue);
    std::shared_ptr<Transfer> t;
    {
        std::lock_guard<std::mutex> lk(q->m);
        auto it = q->live.find(token);
        if (it == q->live.end()) {
            auto f = std::find_if(q->finished.begin(), q->finished.end(),
                                  [token](const auto& e) { return e.first == token; });
            if (f == q->finished.end()) return 0;
            q->finished.erase(f);
            if (q->finished.empty()) clear(q);
            return 1;
        }
        t = it->second;
        q->live.erase(it);
    }
    if (!q->op.try_lock_for(std::chrono::milliseconds(wait_ms))) {
        t->cancelled = true;  // the thread touches it no more after its current call
        return -1;
    }
    t->cancelled = true;
    q->op.unlock();
    return 1;
}

// Stop the thread (after its current NIXL call) and free the queue; 0, or -1 when the thread did not
// stop within `wait_ms` (it is then left running with the queue, which is never freed).
int pdpair_poster_close(void* queue, int wait_ms) {
    auto* q = static_cast<Queue*>(queue);
    {
        std::unique_lock<std::mutex> lk(q->m);
        q->stop = true;
        q->cv.notify_all();
        if (!q->exited_cv.wait_for(lk, std::chrono::milliseconds(wait_ms), [q] { return q->exited; })) {
            q->thread.detach();
            return -1;
        }
    }
    q->thread.join();
    delete q;
    return 0;
}

}  // extern "C"
