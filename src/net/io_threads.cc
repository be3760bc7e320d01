#include "net/io_threads.h"

#include <algorithm>

namespace idem::net {

IoThreads::IoThreads(int threads) : io_(std::max(1, threads)), work_(io_.get_executor()) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] { io_.run(); });
  }
}

IoThreads::~IoThreads() { Stop(); }

void IoThreads::Stop() {
  work_.reset();
  io_.stop();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace idem::net
