// SPDX-License-Identifier: GPL-2.0
/*
 * Targets: the processes pagetier.ko tracks, their lifetime (attach, exec, exit, detach), their
 * scan work, and the helpers the modes call from the fault path (find a target by address
 * space, count an access). The device (pagetier_main.c) calls these; they call the scan
 * (scan.c) and a mode's detach, and nothing of the device.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mutex.h>
#include <linux/ptrace.h>
#include <linux/rculist.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/sysfs.h>

#include "pagetier.h"

/*
 * targets_lock guards the list of targets (pagetier_targets, nr_targets, each target's node and
 * linked) and nothing else: it is held only to look a target up and take a reference, or to add
 * or unlink one, never across user memory, a target's mmap_lock or a walk. The fault hook reads
 * the list under RCU. Each target's own fields are documented with struct pagetier_target.
 */
LIST_HEAD(pagetier_targets);
static DEFINE_MUTEX(targets_lock);
static unsigned int nr_targets;
static struct workqueue_struct *scan_wq;

/* sysfs knobs (pagetier_main.c shows and sets them) */
unsigned int pagetier_default_scan_period_ms = 1000;
unsigned int pagetier_max_targets = 64;

/**
 * pagetier_find_mm_rcu() - the target tracking @mm.
 * @mm: an address space.
 *
 * Context: rcu_read_lock() held.
 * Return: the target, or NULL.
 */
struct pagetier_target *pagetier_find_mm_rcu(struct mm_struct *mm)
{
	struct pagetier_target *t;

	list_for_each_entry_rcu(t, &pagetier_targets, node) {
		if (READ_ONCE(t->mm) == mm)
			return t;
	}
	return NULL;
}

/**
 * pagetier_count_access() - count one access to the tracked page at @index.
 * @t: the target.
 * @index: virtual address >> PAGE_SHIFT; untracked pages are ignored.
 *
 * Context: any, except with t->pages' lock held. Never allocates.
 */
void pagetier_count_access(struct pagetier_target *t, unsigned long index)
{
	XA_STATE(xas, &t->pages, index);
	unsigned long v;
	void *entry;

	xas_lock(&xas);
	entry = xas_load(&xas);
	if (xa_is_value(entry)) {
		v = xa_to_value(entry);
		if ((v & PT_COUNT_MASK) != PT_COUNT_MASK)
			v++;
		xas_store(&xas, xa_mk_value(v | PT_SEEN)); /* replaces a present entry: no allocation */
		xas_set_mark(&xas, PT_ACCESSED);
		atomic64_inc(&t->accesses);
	}
	xas_unlock(&xas);
}

static struct pagetier_target *find_pid_locked(pid_t pid)
{
	struct pagetier_target *t;

	lockdep_assert_held(&targets_lock);
	list_for_each_entry(t, &pagetier_targets, node) {
		if (t->pid == pid)
			return t;
	}
	return NULL;
}

/* The last reference is gone: nothing else can reach @t. */
static void target_release(struct kref *ref)
{
	struct pagetier_target *t = container_of(ref, struct pagetier_target, ref);

	xa_destroy(&t->pages);
	xa_destroy(&t->regions);
	mmdrop(t->mm);
	put_pid(t->spid);
	kfree(t);
}

/**
 * pagetier_target_put() - drop a reference taken by pagetier_target_get().
 * @t: the target.
 */
void pagetier_target_put(struct pagetier_target *t)
{
	kref_put(&t->ref, target_release);
}

/**
 * pagetier_target_get() - the target attached for @pid.
 * @pid: its process id.
 *
 * Return: the target with a reference the caller puts with pagetier_target_put(), or NULL.
 */
struct pagetier_target *pagetier_target_get(pid_t pid)
{
	struct pagetier_target *t;

	mutex_lock(&targets_lock);
	t = find_pid_locked(pid);
	if (t)
		kref_get(&t->ref);
	mutex_unlock(&targets_lock);
	return t;
}

/* Take @t off the list; the caller then owns the list's reference. */
static void target_unlink_locked(struct pagetier_target *t)
{
	lockdep_assert_held(&targets_lock);
	list_del_rcu(&t->node);
	t->linked = false;
	nr_targets--;
}

/*
 * The target's address space is gone: if the process lives on, it called execve. Follow it to
 * its new address space, with fresh counts. Runs in the scan work, the only writer of t->mm.
 * Return: true if the target now tracks that one.
 */
static bool follow_exec(struct pagetier_target *t)
{
	struct task_struct *task = get_pid_task(t->spid, PIDTYPE_PID);
	struct mm_struct *mm = task ? get_task_mm(task) : NULL;
	struct mm_struct *old = t->mm;

	if (task)
		put_task_struct(task);
	if (!mm)
		return false;
	if (mm == old) { /* exiting, not yet gone */
		mmput(mm);
		return false;
	}
	mmgrab(mm);
	mmput(mm);
	down_write(&t->mm_lock);
	WRITE_ONCE(t->mm, mm); /* the fault hook only compares this pointer */
	t->exec_gen++;
	xa_destroy(&t->pages);
	xa_destroy(&t->regions);
	up_write(&t->mm_lock);
	t->pass_started = false;
	t->walked_last = 0;
	WRITE_ONCE(t->pages_tracked, 0);
	WRITE_ONCE(t->pages_shmem, 0);
	WRITE_ONCE(t->pages_file, 0);
	mmdrop(old);
	pr_debug("pid %d called execve; following it\n", t->pid);
	return true;
}

/* Unlinked by someone else: wait until the fault hook and the scan are done with @t. */
static void target_quiesce(struct pagetier_target *t)
{
	WRITE_ONCE(t->stopping, true); /* a scan work probing ends at its next window */
	synchronize_rcu();
	cancel_delayed_work_sync(&t->work);
}

/* Undo every change the mode made to the target's page tables, if its address space lives. */
static void target_restore(struct pagetier_target *t)
{
	struct mm_struct *mm;

	if (!t->ops->detach)
		return;
	down_read(&t->mm_lock);
	mm = t->mm;
	if (mmget_not_zero(mm)) {
		mmap_read_lock(mm);
		t->ops->detach(t);
		mmap_read_unlock(mm);
		mmput(mm);
	}
	up_read(&t->mm_lock);
}

/* The caller unlinked @t and owns the list's reference: stop, restore, put. */
static void detach_target(struct pagetier_target *t)
{
	target_quiesce(t);
	target_restore(t);
	pagetier_target_put(t);
}

/*
 * The wait before the next period of @t, whose period began at @started (jiffies).
 *
 * A mode with period_from_start (abit) starts its periods scan_period_ms apart, however long
 * each took: a count there says whether a page's Accessed bit was set since the last pass read
 * it, whatever the time between passes, and a pass of hundreds of milliseconds (a large target,
 * the window and the probes' sleeps) would otherwise stretch a 250 ms period to a second or
 * more, and leave 1 s intervals with no pass at all. A period that overran its length is
 * followed after a quarter of a period rather than at the next multiple of it: what the pass
 * read is already older than asked, and skipping would age it further for nothing, while the
 * quarter keeps a target whose passes always overrun from holding a worker busy back to back:
 * every pass is followed by a rest of at least a quarter period. Periods never overlap, as the
 * work item is queued again only by itself, at its end; the next period's window and probe
 * windows still sleep between its walks, and STATS scan_ns shows what the walks cost.
 *
 * Fault mode waits a whole period after each one's end: its hinting marks count accesses from
 * the pass that left them until the next, and timed start to start its frequency ranking lost
 * the contrast between hot and cold pages (docs/kmod.md, "When a period starts").
 *
 * In both modes a period the scan budget cut (the pass goes on from its cursor) is followed
 * after the rest only: the tables it left are the pass's own, not yet read in it, and waiting
 * a whole period for each cut would stretch the pass by a period per cut. A large target's
 * passes are cut after its attach (the first reads every table, the next ones every table the
 * program touched meanwhile), so this shortens the seconds before its passes fit in one period
 * again; it changes neither what a count means nor the time between a pass's end and the next.
 */
static unsigned long next_scan_delay(const struct pagetier_target *t, unsigned long started)
{
	unsigned long period = msecs_to_jiffies(t->scan_period_ms);
	unsigned long spent = jiffies - started, rest = period / 4;

	if (t->pass_started)
		return rest;
	if (!t->ops->period_from_start)
		return period;
	return spent + rest < period ? period - spent : rest;
}

static void scan_work(struct work_struct *work)
{
	struct pagetier_target *t = container_of(to_delayed_work(work), struct pagetier_target, work);
	unsigned long started = jiffies;
	bool mine = false;
	int ret = pagetier_scan(t);

	if (ret == -ESRCH && follow_exec(t))
		ret = pagetier_scan(t);
	if (ret != -ESRCH) {
		queue_delayed_work(scan_wq, &t->work, next_scan_delay(t, started));
		return;
	}
	/* the target exited: forget it, unless whoever unlinked it already owns it */
	mutex_lock(&targets_lock);
	if (t->linked) {
		target_unlink_locked(t);
		mine = true;
	}
	mutex_unlock(&targets_lock);
	if (!mine)
		return;
	pr_info("pid %d exited; forgotten\n", t->pid);
	synchronize_rcu(); /* the fault hook may still look at it */
	pagetier_target_put(t); /* the list's: a work item may free itself */
}

/* The address space of @pid, if the caller may track it (grabbed: the caller mmdrops it). */
static struct mm_struct *grab_target_mm(struct pid *spid, long *err)
{
	struct task_struct *task = spid ? get_pid_task(spid, PIDTYPE_PID) : NULL;
	struct mm_struct *mm = NULL;

	*err = -ESRCH;
	if (!task)
		return NULL;
	if (task->flags & PF_KTHREAD) {
		*err = -EINVAL;
		goto out;
	}
	/* the check /proc/PID/pagemap applies to its readers */
	if (!pt_ptrace_may_access(task, PTRACE_MODE_READ_FSCREDS)) {
		*err = -EACCES;
		goto out;
	}
	mm = get_task_mm(task); /* NULL: exiting */
	if (mm) {
		mmgrab(mm);
		mmput(mm);
	}
out:
	put_task_struct(task);
	return mm;
}

/**
 * pagetier_target_attach() - start tracking a process.
 * @owner: the descriptor attaching it; closing it detaches (pagetier_detach_owned()).
 * @a: the request, checked by the caller.
 * @ops: the mode's operations.
 *
 * Return: 0; -ESRCH (no such process, or exiting), -EINVAL (a kernel thread), -EACCES (the
 * caller may not read its memory), -EBUSY (attached already), -ENOSPC (max_targets reached),
 * -ENOMEM.
 */
long pagetier_target_attach(const struct file *owner, const struct pagetier_attach *a,
			    const struct pagetier_mode_ops *ops)
{
	struct pagetier_target *t;
	long ret;

	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return -ENOMEM;
	t->spid = find_get_pid(a->pid);
	t->mm = grab_target_mm(t->spid, &ret);
	if (!t->mm) {
		put_pid(t->spid);
		kfree(t);
		return ret;
	}
	kref_init(&t->ref); /* the list's */
	t->pid = a->pid;
	t->owner = owner;
	init_rwsem(&t->mm_lock);
	t->ops = ops;
	t->scan_period_ms = a->scan_period_ms ?: READ_ONCE(pagetier_default_scan_period_ms);
	t->sample_ratio = max_t(u32, a->sample_ratio, 1);
	t->page_budget = a->page_budget;
	t->attach_flags = a->flags;
	xa_init(&t->pages);
	xa_init(&t->regions);
	INIT_DELAYED_WORK(&t->work, scan_work);

	mutex_lock(&targets_lock);
	rcu_read_lock();
	ret = pagetier_find_mm_rcu(t->mm) ? -EBUSY : 0;
	rcu_read_unlock();
	if (!ret && find_pid_locked(a->pid))
		ret = -EBUSY;
	if (!ret && nr_targets >= READ_ONCE(pagetier_max_targets))
		ret = -ENOSPC;
	if (ret) {
		mutex_unlock(&targets_lock);
		pagetier_target_put(t);
		return ret;
	}
	list_add_tail_rcu(&t->node, &pagetier_targets);
	t->linked = true;
	nr_targets++;
	queue_delayed_work(scan_wq, &t->work, 0);
	mutex_unlock(&targets_lock);
	pr_debug("attached pid %d, mode %s\n", t->pid, t->ops->name);
	return 0;
}

/**
 * pagetier_target_detach() - stop tracking @pid, restoring what its mode changed.
 * @pid: its process id.
 *
 * Return: 0, or -ESRCH if it is not attached.
 */
long pagetier_target_detach(pid_t pid)
{
	struct pagetier_target *t;

	mutex_lock(&targets_lock);
	t = find_pid_locked(pid);
	if (t)
		target_unlink_locked(t);
	mutex_unlock(&targets_lock);
	if (!t)
		return -ESRCH;
	detach_target(t);
	return 0;
}

/*
 * Detach, one at a time, each target @match picks (@owner: its argument), the list lock not
 * held while a target is restored.
 */
static void detach_each(bool (*match)(const struct pagetier_target *t, const struct file *owner),
			const struct file *owner)
{
	struct pagetier_target *t, *found;

	for (;;) {
		found = NULL;
		mutex_lock(&targets_lock);
		list_for_each_entry(t, &pagetier_targets, node) {
			if (match(t, owner)) {
				found = t;
				break;
			}
		}
		if (found)
			target_unlink_locked(found);
		mutex_unlock(&targets_lock);
		if (!found)
			return;
		pr_debug("pid %d detached\n", found->pid);
		detach_target(found);
	}
}

static bool owned_by(const struct pagetier_target *t, const struct file *owner)
{
	return t->owner == owner;
}

static bool any_target(const struct pagetier_target *t, const struct file *owner)
{
	return true;
}

/**
 * pagetier_detach_owned() - detach the targets attached through @owner.
 * @owner: a descriptor whose last reference is gone (closed, or its process died), so that no
 *	   process stays marked by a dead profiler.
 */
void pagetier_detach_owned(const struct file *owner)
{
	detach_each(owned_by, owner);
}

/**
 * pagetier_targets_emit() - one line per target for sysfs: pid, mode, passes, pages tracked.
 * @buf: the sysfs page.
 *
 * Return: the bytes written.
 */
int pagetier_targets_emit(char *buf)
{
	struct pagetier_target *t;
	int len = 0;

	mutex_lock(&targets_lock);
	list_for_each_entry(t, &pagetier_targets, node)
		len += sysfs_emit_at(buf, len, "%d %s %llu %llu\n", t->pid, t->ops->name,
				     READ_ONCE(t->scans), READ_ONCE(t->pages_tracked));
	mutex_unlock(&targets_lock);
	return len;
}

/**
 * pagetier_targets_init() - the scan workqueue.
 *
 * Return: 0 or -ENOMEM.
 */
int pagetier_targets_init(void)
{
	scan_wq = alloc_workqueue("pagetier", WQ_UNBOUND, 0);
	return scan_wq ? 0 : -ENOMEM;
}

/**
 * pagetier_targets_exit() - detach every target, restoring every page a mode left
 * inaccessible, then free the workqueue.
 *
 * Context: no new attach can come (the device is gone).
 */
void pagetier_targets_exit(void)
{
	detach_each(any_target, NULL);
	destroy_workqueue(scan_wq);
}

/**
 * pagetier_uint_store() - parse a sysfs write into @knob, if within [@lo, @hi].
 * @buf: what was written.
 * @count: its length.
 * @knob: the value to set.
 * @lo: the smallest value allowed.
 * @hi: the largest value allowed.
 *
 * Return: @count, or -EINVAL (out of range) or kstrtouint()'s error.
 */
ssize_t pagetier_uint_store(const char *buf, size_t count, unsigned int *knob, unsigned int lo,
			    unsigned int hi)
{
	unsigned int v;
	int ret = kstrtouint(buf, 0, &v);

	if (ret)
		return ret;
	if (v < lo || v > hi)
		return -EINVAL;
	WRITE_ONCE(*knob, v);
	return count;
}
