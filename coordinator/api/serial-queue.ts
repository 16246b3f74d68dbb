// Runs async tasks one after another, each once the previous one has settled (fulfilled or rejected), in the order
// they were given. A task's own result or error is its caller's; it never reaches the next task.

export class SerialQueue {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(task: () => Promise<T>): Promise<T> {
    const result = this.tail.then(task);
    this.tail = result.catch(() => undefined);
    return result;
  }
}
