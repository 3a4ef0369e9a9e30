// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in secondary MMU for tests only (tests/guest/test_kmod_hazards.py): an mmu notifier
 * on one process's address space, as KVM or a device driver registers, that counts the calls
 * pagetier makes and answers the young checks with the parameter young (1: "my mapping of the
 * range was accessed"). Not installed, not loaded outside the tests.
 *
 *   insmod pt_notifier_test.ko pid=PID [young=1]
 *   /sys/module/pt_notifier_test/parameters/{clear_young,test_young,starts,ends,young}
 */
#include <linux/atomic.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/pid.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>

static int pid;
module_param(pid, int, 0444);
MODULE_PARM_DESC(pid, "the process whose address space gets the notifier");
static int young = 1;
module_param(young, int, 0644);
MODULE_PARM_DESC(young, "what clear_young and test_young answer");

static atomic_t n_clear_young, n_test_young, n_starts, n_ends;

static int counter_get(char *buf, const struct kernel_param *kp)
{
	return scnprintf(buf, PAGE_SIZE, "%d\n", atomic_read((atomic_t *)kp->arg));
}

static const struct kernel_param_ops counter_ops = { .get = counter_get };
module_param_cb(clear_young, &counter_ops, &n_clear_young, 0444);
module_param_cb(test_young, &counter_ops, &n_test_young, 0444);
module_param_cb(starts, &counter_ops, &n_starts, 0444);
module_param_cb(ends, &counter_ops, &n_ends, 0444);

static int nt_clear_young(struct mmu_notifier *sub, struct mm_struct *mm, unsigned long start,
			  unsigned long end)
{
	atomic_inc(&n_clear_young);
	return READ_ONCE(young);
}

static int nt_test_young(struct mmu_notifier *sub, struct mm_struct *mm, unsigned long address)
{
	atomic_inc(&n_test_young);
	return READ_ONCE(young);
}

static int nt_start(struct mmu_notifier *sub, const struct mmu_notifier_range *range)
{
	atomic_inc(&n_starts);
	return 0;
}

static void nt_end(struct mmu_notifier *sub, const struct mmu_notifier_range *range)
{
	atomic_inc(&n_ends);
}

static const struct mmu_notifier_ops nt_ops = {
	.clear_young = nt_clear_young,
	.test_young = nt_test_young,
	.invalidate_range_start = nt_start,
	.invalidate_range_end = nt_end,
};

static struct mmu_notifier nt = { .ops = &nt_ops };
static bool registered;

static int __init nt_init(void)
{
	struct task_struct *task = get_pid_task(find_vpid(pid), PIDTYPE_PID);
	struct mm_struct *mm;
	int ret;

	if (!task)
		return -ESRCH;
	mm = get_task_mm(task);
	put_task_struct(task);
	if (!mm)
		return -ESRCH;
	ret = mmu_notifier_register(&nt, mm); /* holds the mm (mmgrab) until unregistered */
	mmput(mm);
	registered = !ret;
	return ret;
}

static void __exit nt_exit(void)
{
	if (registered)
		mmu_notifier_unregister(&nt, nt.mm);
}

module_init(nt_init);
module_exit(nt_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("pagetier tests: a stand-in secondary MMU");
