#pragma once

// The tokens of one request, from the engine's thread (push) to the HTTP thread that
// answers it (pop), and the end of the server's service (abort: shutdown, or the
// engine failed).

#include <torchattn/models/engine.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>

namespace serve {

class Channel {
 public:
  enum class Pop { Event, Timeout, Aborted };

  void push(const torchattn::models::TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(e);
    ready_.notify_one();
  }

  void abort(int status, std::string message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    status_ = status;
    message_ = std::move(message);
    ready_.notify_one();
  }

  /// The next event (Event), none within `timeout` (Timeout), or the service ended
  /// (Aborted: abort_status() and abort_message() say why). Events come first.
  Pop pop(torchattn::models::TokenEvent& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return !events_.empty() || aborted_; });
    if (!events_.empty()) {
      out = events_.front();
      events_.pop_front();
      return Pop::Event;
    }
    return aborted_ ? Pop::Aborted : Pop::Timeout;
  }

  int abort_status() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }
  std::string abort_message() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return message_;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<torchattn::models::TokenEvent> events_;
  bool aborted_ = false;
  int status_ = 0;
  std::string message_;
};

}  // namespace serve
