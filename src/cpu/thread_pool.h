// A fixed pool of worker threads for the host kernels. parallel_for splits [0, n) into
// contiguous chunks, one per thread, and the caller's thread takes one chunk itself.
// Idle workers sleep on a condition variable: a process that is waiting for input burns no
// CPU (llama.cpp's spinning pool is faster by a few microseconds a dispatch; at ~100
// dispatches a token that is well under 1% of a 1B model's decode step on this machine).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace frink {

class ThreadPool {
 public:
  // n_threads <= 0 means one per hardware core.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) over a partition of [0, n) and returns when all
  // chunks are done. Chunks are multiples of `grain` (the last may be shorter).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace frink
