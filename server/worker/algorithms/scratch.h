// Scratch: host buffers the reductions reuse from call to call for their
// wide copies (partials of f16/bf16 in f32, of an integer avg in 64 bits),
// so a large call does not pay for fresh pages every time. At most
// kMaxIdle buffers stay allocated while idle, each as large as the largest
// call it served.
//
// Lifecycle: one process-wide pool (Get()); a Scratch holds one buffer for
// the length of a call and gives it back when destroyed.
// Thread safety: the pool is thread-safe; each Scratch is used by one
// thread.
#ifndef CHORUS_SERVER_WORKER_ALGORITHMS_SCRATCH_H_
#define CHORUS_SERVER_WORKER_ALGORITHMS_SCRATCH_H_

#include <memory>
#include <string>

namespace chorus {

class Scratch {
 public:
  // Takes an idle buffer from the pool, or a new empty one.
  Scratch();
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // The buffer; its contents are whatever the last user left.
  std::string& bytes() { return *buffer_; }

  static constexpr int kMaxIdle = 2;

 private:
  std::unique_ptr<std::string> buffer_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_ALGORITHMS_SCRATCH_H_
